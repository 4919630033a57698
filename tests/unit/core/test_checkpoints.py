from ktdeploy.core import checkpoints as ck

FULL = ["adapter_model.safetensors", "adapter_config.json", "optimizer.pt", "scheduler.pt", "rng_state.pth",
        "training_args.bin", "trainer_state.json"]


def listing(**dirs):
    return "\n".join(f"{d}/{f}" for d, files in dirs.items() for f in files) + "\ntrainer_log.jsonl\n"


def test_newest_complete_skips_partial_newer_checkpoint():
    text = listing(**{"checkpoint-10": FULL, "checkpoint-20": FULL, "checkpoint-30": FULL[:3]})
    lst = ck.parse_listing(text)
    best = ck.newest_complete(lst)
    assert best.name == "checkpoint-20" and best.step == 20 and best.world_size == 1
    partial = ck.inspect_checkpoint("checkpoint-30", lst["checkpoint-30"])
    assert not partial.complete
    assert "trainer_state.json" in partial.missing and "scheduler.pt" in partial.missing


def test_numeric_not_lexical_order():
    lst = ck.parse_listing(listing(**{"checkpoint-9": FULL, "checkpoint-100": FULL}))
    assert ck.newest_complete(lst).name == "checkpoint-100"


def test_world_size_from_rng_files_and_fsdp_layouts():
    files = ["adapter_model.safetensors", "optimizer_0/__0_0.distcp", "scheduler.pt", "trainer_state.json",
             "rng_state_0.pth", "rng_state_1.pth"]
    c = ck.inspect_checkpoint("checkpoint-5", files)
    assert c.complete and c.world_size == 2
    # optimizer_0/ listed but empty is not an optimizer state
    c2 = ck.inspect_checkpoint("checkpoint-5", ["adapter_model.safetensors", "optimizer_0", "scheduler.pt",
                                                 "trainer_state.json", "rng_state.pth"])
    assert not c2.complete


def test_no_checkpoint_and_non_checkpoint_names_ignored():
    lst = ck.parse_listing("incomplete-checkpoint-40/optimizer.pt\ncheckpoint-x/a\ntmp-checkpoint-3/a\n")
    assert lst == {}
    assert ck.newest_complete(lst) is None


def test_world_size_filter():
    lst = ck.parse_listing(listing(**{"checkpoint-10": FULL}))
    assert ck.newest_complete(lst, world_size=2) is None
    assert ck.newest_complete(lst, world_size=1).name == "checkpoint-10"
