"""rules_stack.NOT_PARSED_KEYS against the argument classes dumped from the image's wheels.

LlamaFactory's training parser (_TRAIN_ARGS) reads Model/Data/Training/Finetuning/GeneratingArguments; the keys
check refuses as 'not used by the HfArgumentParser' must be exactly the MegatronBridgeArguments/EvaluationArguments
fields that none of those classes defines (tests/oracle/stack_catalog.json, tests/oracle/extract_stack_catalog.py).
"""

from __future__ import annotations

import json

from ktdeploy.core.recipe import catalog_data as cd
from ktdeploy.core.recipe import rules_stack
from tests.oracle import independent_gen as gen


def test_not_parsed_keys_are_exactly_the_fields_the_training_parser_lacks():
    dumped = json.loads((gen.REPO / "tests" / "oracle" / "stack_catalog.json").read_text())["llamafactory"]
    parsed = {f["name"] for fields in dumped.values() for f in fields}
    assert set(dumped) == {"ModelArguments", "DataArguments", "TrainingArguments", "FinetuningArguments",
                           "GeneratingArguments"}
    others = {k for k, owner in cd.TRAIN_KEYS.items() if owner in rules_stack.NOT_PARSED_FOR_TRAINING}
    assert others - parsed == rules_stack.NOT_PARSED_KEYS
    assert "seed" in others & parsed       # EvaluationArguments and TrainingArguments both define it: kept
