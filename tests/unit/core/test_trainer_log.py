import json

from ktdeploy.core import trainer_log

# A line exactly as LlamaFactory's LogCallback writes it (keys with None values dropped).
LINE = json.dumps({"current_steps": 40, "total_steps": 100, "loss": 1.2345, "lr": 9.5e-05, "epoch": 0.4,
                   "percentage": 40.0, "elapsed_time": "0:00:43", "remaining_time": "0:01:05",
                   "throughput": 1407.5, "total_tokens": 81920})


def test_parse_line_keys():
    e = trainer_log.parse_line(LINE)
    assert (e.current_steps, e.total_steps, e.loss, e.throughput, e.total_tokens) == (40, 100, 1.2345, 1407.5, 81920)
    assert e.remaining_time == "0:01:05"


def test_latest_ignores_torn_last_line_and_eval_lines_keep_steps():
    text = LINE + "\n" + '{"current_steps": 45, "total_st'
    assert trainer_log.latest(text).current_steps == 40
    ev = json.dumps({"current_steps": 5, "total_steps": 10, "percentage": 50.0, "elapsed_time": "0:00:01",
                     "remaining_time": "0:00:01"})
    assert trainer_log.latest(LINE + "\n" + ev).loss is None
    assert trainer_log.last_loss(LINE + "\n" + ev) == 1.2345


def test_garbage_and_empty():
    assert trainer_log.latest("") is None
    assert trainer_log.latest("not json\n[1,2]\n{}\n") is None


def test_hms_and_describe():
    assert trainer_log.hms_seconds("0:01:05") == 65
    assert trainer_log.hms_seconds("1 day, 2:00:00") == 93600
    assert trainer_log.hms_seconds("x") is None
    d = trainer_log.describe(trainer_log.parse_line(LINE))
    assert "step 40/100" in d and "loss 1.2345" in d and "1408 tok/s" in d and "eta 0:01:05" in d
    assert trainer_log.describe(None).startswith("waiting")
