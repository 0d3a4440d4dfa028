"""The one orchestrator: a snapshot's evaluate -> decide -> compact -> describe.

:class:`Pipeline` owns the sequence for every caller: ``compactor compact`` runs it whole in
process (:meth:`Pipeline.run`); the worker service (:mod:`worker.runtime.service`) calls
:meth:`~Pipeline.parse`, :meth:`~Pipeline.evaluate` and :meth:`~Pipeline.compact` between
the steps it owns itself (the lock, the lease, re-runs and publishing). Nothing here reads the
environment or talks to Redis; the outside world comes in as :class:`Adapters`, and what the
process keeps between snapshots as its :class:`~worker.reuse.Reuse`.

One module per step, named after it, each over the snapshot's :class:`SnapshotContext`
(``context.py``: the parsed snapshot with its tokenizer, projection policy and media rules,
built once): ``evaluate.py`` (project, count, the threshold), ``memo.py`` (the same with the
conversation's stored memo), ``prepare.py`` (the range and what is carried), ``summarize.py``
(the summary per mode, checked), ``reduce.py`` (under a ``[compaction] reduction`` strategy:
the range reduced and described instead of summarized), ``describe.py`` (the event's
compaction and the transcript), ``cost.py`` (the compaction's cost, estimated and measured);
``orchestrator.py`` runs them in order.

The step functions named like their modules (``evaluate``, ``prepare``, ``summarize``) are
imported from their modules (``from worker.pipeline.evaluate import evaluate``): re-exported
here they would hide the modules themselves (``import worker.pipeline.evaluate as m`` would
give the function).
"""

from worker.pipeline.context import SnapshotContext, snapshot_context, tokenizer_of
from worker.pipeline.describe import (
    SUMMARY_ID_PREFIX,
    build_compaction,
    history_tokens,
    tokens_of,
    transcript_payload,
)
from worker.pipeline.evaluate import Evaluation, UsagePrefix, take_usage
from worker.pipeline.memo import MemoUpdate, StoredBlob, evaluate_with_memo
from worker.pipeline.orchestrator import Adapters, Pipeline, Verdict
from worker.pipeline.prepare import PreparedCompaction

__all__ = [
    "SUMMARY_ID_PREFIX",
    "Adapters",
    "Evaluation",
    "MemoUpdate",
    "Pipeline",
    "PreparedCompaction",
    "SnapshotContext",
    "StoredBlob",
    "UsagePrefix",
    "Verdict",
    "build_compaction",
    "evaluate_with_memo",
    "history_tokens",
    "snapshot_context",
    "take_usage",
    "tokenizer_of",
    "tokens_of",
    "transcript_payload",
]
