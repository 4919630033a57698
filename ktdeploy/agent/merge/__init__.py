"""``ktdeploy merge``: fold a KT LoRA (routed-expert + PEFT parts) into the base model's weights (numpy, streaming).

See ``run`` for the command, ``layout`` for which term goes where, ``arith`` for the arithmetic and ``stream``
for the bounded-memory shard writer."""

from ktdeploy.agent.merge.layout import MergeError
from ktdeploy.agent.merge.run import MERGE_MANIFEST, MergeSummary, merge

__all__ = ["MERGE_MANIFEST", "MergeError", "MergeSummary", "merge"]
