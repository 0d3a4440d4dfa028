// A webhook receiver on loopback verifying the real deliveries of a real `compactor serve`
// (registered by this client), and a review hook answering with a signed decision.

import assert from "node:assert/strict";
import { createServer, type IncomingMessage, type Server } from "node:http";
import { describe, test } from "node:test";

import { SIGNATURE_HEADER, parseEvent, signWebhook, verifyWebhook, type CompactionEvent } from "../src/index.js";
import { client, conversationId, eventually, history, needsService } from "./support.js";

interface Delivery {
  headers: IncomingMessage["headers"];
  body: Buffer;
}

/** An HTTP server on 127.0.0.1 that keeps each POST's headers and raw body, and answers with
 * what `answer` says. */
async function receiver(
  answer: (delivery: Delivery) => { status: number; headers?: Record<string, string>; body?: string } = () => ({ status: 204 }),
): Promise<{ url: string; deliveries: Delivery[]; server: Server }> {
  const deliveries: Delivery[] = [];
  const server = createServer((request, response) => {
    const chunks: Buffer[] = [];
    request.on("data", (chunk: Buffer) => chunks.push(chunk));
    request.on("end", () => {
      const delivery = { headers: request.headers, body: Buffer.concat(chunks) };
      deliveries.push(delivery);
      const { status, headers, body } = answer(delivery);
      response.writeHead(status, headers).end(body);
    });
  });
  await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", resolve));
  const address = server.address();
  const port = typeof address === "object" && address !== null ? address.port : 0;
  return { url: `http://127.0.0.1:${port}/hooks`, deliveries, server };
}

describe("webhooks from a real serve", { skip: needsService() }, () => {
  test("each delivery verifies with the secret, against its raw body, and not with another", async () => {
    const api = client();
    const id = conversationId("hook");
    const hook = await receiver();
    const webhook = await api.createWebhook({ url: hook.url, conversation_id: id, types: ["compaction.completed"] });
    try {
      assert.match(webhook.id, /^wh_[0-9a-f]{16}$/);
      assert.ok(webhook.secret?.startsWith("whsec_"));
      assert.ok((await api.webhooks()).every((w) => w.secret === undefined));
      await api.submit({ conversation_id: id, revision: 1, messages: history(8) });
      const delivery = await eventually("a delivery", () => hook.deliveries[0], 120_000);
      const header = String(delivery.headers[SIGNATURE_HEADER.toLowerCase()]);
      assert.ok(verifyWebhook(webhook.secret, header, delivery.body));
      assert.ok(!verifyWebhook("whsec_another", header, delivery.body));
      assert.ok(!verifyWebhook(webhook.secret, header, Buffer.concat([delivery.body, Buffer.from(" ")])));
      const event: CompactionEvent = parseEvent(delivery.body);
      assert.equal(event.type, "compaction.completed");
      assert.equal(event.conversation_id, id);
    } finally {
      await api.deleteWebhook(webhook.id);
      hook.server.close();
    }
  });

  test("a review hook's signed answer decides a held compaction", async () => {
    const api = client();
    const id = conversationId("review-hook");
    let secret = "";
    const hook = await receiver((delivery) => {
      const proposal = parseEvent(delivery.body);
      const body = JSON.stringify({ event_id: proposal.event_id, decision: "reject", reason: "keep the plan" });
      const signature = signWebhook(secret, Math.floor(Date.now() / 1000), body);
      return { status: 200, headers: { "Content-Type": "application/json", [SIGNATURE_HEADER]: signature }, body };
    });
    const webhook = await api.createWebhook({ url: hook.url, conversation_id: id, types: ["compaction.proposed"] });
    secret = webhook.secret ?? "";
    try {
      await api.submit({ conversation_id: id, revision: 1, messages: history(8), config: { review: true } });
      const declined = await eventually("the declined proposal", async () =>
        (await api.events(id)).find((e) => e.type === "compaction.declined"),
        120_000,
      );
      assert.equal((declined as { declined_by?: string }).declined_by, "webhook");
      assert.equal((declined as { reason?: string }).reason, "keep the plan");
    } finally {
      await api.deleteWebhook(webhook.id);
      hook.server.close();
    }
  });
});
