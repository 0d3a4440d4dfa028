"""Kombu's Redis transport with one workaround, used by the Celery app (``broker_transport``).

The bug (kombu 5.7.0, the newest release, and every earlier 5.x; the same family as
celery/kombu#582): when a worker loses Redis, Celery's consumer calls
``Connection.collect()`` and then ``Connection.close()`` on the broken connection
(celery/worker/consumer/consumer.py, ``on_connection_error_after_connected``).

1. ``collect()`` (kombu/connection.py, ``collect`` -> ``_do_close_self``) closes the channels,
   but a channel's ``close()`` can stop half-way on a connection error: the Redis channel first
   reads the reply of a BRPOP still outstanding (``Channel.close`` -> ``_brpop_read``), and
   deleting auto-delete fanout queues needs Redis too (``queue_delete``). Kombu swallows those
   errors, so the channel stays open, its unacknowledged deliveries still in its QoS.
   ``collect()`` then detaches the transport from its connection anyway
   (``_do_close_transport``: ``transport.client = None``).
2. ``close()`` closes ``Connection._default_channel`` (the task channel, never reset by
   ``collect()``) again. Its pool was dropped by the first attempt, so restoring its unacked
   messages (``QoS.restore_unacked_once`` -> ``restore_unacked`` -> ``conn_or_acquire``) builds
   a new pool from ``_connparams()``, which reads ``self.connection.client.hostname``: an
   ``AttributeError`` on ``None``. That is no connection error, so neither kombu's
   ``maybe_close_channel`` nor Celery's ``ignore_errors`` catches it: it reaches the worker's
   blueprint ("Unrecoverable error") and the worker exits with status 1. Acknowledging a
   message of that channel later (a task finishing after the outage, or the hub's pending
   acks at shutdown) fails the same way.

It needs a busy worker: only a channel holding unacknowledged deliveries goes to Redis when it
is closed, so an idle worker reconnects fine; the more slots are busy (long LLM calls, CPU
work in the threads pool), the likelier the crash.

The workaround: a channel whose transport was detached from its connection raises redis-py's
``ConnectionError`` (one of kombu's ``connection_errors``) when it needs a new connection,
instead of the ``AttributeError``. Kombu and Celery then treat it like every other failure of
a broken connection: the consumer reconnects with a new connection and channel. Nothing is
lost: the deliveries it could not restore or acknowledge are still in Redis' unacked index and
``restore_visible`` puts them back on their queue after ``visibility_timeout``; the tasks are
idempotent, so a redelivered one finds its event published. Remove this module (and the
``broker_transport`` setting in :mod:`worker.runtime.celery_app`) once kombu no longer
dereferences a detached transport's client there.
"""

from __future__ import annotations

from typing import Any

import redis.exceptions
from kombu.transport import redis as kombu_redis


class Channel(kombu_redis.Channel):
    def _connparams(self, asynchronous: bool = False) -> dict[str, Any]:
        transport = self.connection
        if transport is None or transport.client is None:
            raise redis.exceptions.ConnectionError(
                "the broker connection of this channel was closed (kombu channel left open "
                "after a connection loss)"
            )
        params: dict[str, Any] = super()._connparams(asynchronous=asynchronous)  # type: ignore[no-untyped-call]
        return params


class Transport(kombu_redis.Transport):
    Channel = Channel


TRANSPORT = f"{__name__}:Transport"
