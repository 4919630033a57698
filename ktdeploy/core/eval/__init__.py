"""Did the fine-tune work? (pure): the evaluation set read the way LlamaFactory reads a dataset (``dataset``), the
held-out split `up` carves before training (``split``), LlamaFactory's own generation metrics (``score``) and the
side-by-side summary of base and tuned answers (``summary``)."""
