"""core/eval/dataset.py: rows become (messages, reference) as LlamaFactory's converters make them."""

import json

import pytest

from ktdeploy.core.errors import UsageError
from ktdeploy.core.eval import dataset as ds


def _load(info: dict, name: str, rows: list) -> ds.Loaded:
    e = ds.entry(info, name)
    return ds.samples(e, ds.parse_rows(json.dumps(rows), e.file_name))


def test_alpaca_prompt_is_instruction_newline_input_with_history_and_system():
    info = {"a": {"file_name": "a.json", "columns": {"history": "history", "system": "sys"}}}
    got = _load(info, "a", [{"instruction": "Add", "input": "1 2", "output": "3", "sys": "be brief",
                             "history": [["hi", "hello"]]}])
    s = got.samples[0]
    assert s.messages == ({"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"},
                          {"role": "assistant", "content": "hello"}, {"role": "user", "content": "Add\n1 2"})
    assert s.reference == "3" and s.id == "a:0" and s.prompt_text() == "Add\n1 2"


def test_alpaca_custom_columns_and_a_row_without_output_has_no_reference():
    info = {"q": {"file_name": "q.jsonl", "columns": {"prompt": "question", "query": None, "response": "answer"}}}
    got = _load(info, "q", [{"question": "why?", "answer": "because"}, {"question": "and?"}])
    assert [s.reference for s in got.samples] == ["because", None]
    assert got.samples[0].messages[-1]["content"] == "why?"


def test_sharegpt_system_turn_tags_and_reference_is_the_last_assistant_turn():
    info = {"s": {"file_name": "s.json", "formatting": "sharegpt"}}
    rows = [{"conversations": [{"from": "system", "value": "S"}, {"from": "human", "value": "q1"},
                               {"from": "gpt", "value": "a1"}, {"from": "human", "value": "q2"},
                               {"from": "gpt", "value": "a2"}]}]
    s = _load(info, "s", rows).samples[0]
    assert [m["role"] for m in s.messages] == ["system", "user", "assistant", "user"]
    assert s.reference == "a2"


def test_openai_spelling_and_broken_role_order_is_skipped_like_llamafactory():
    info = {"o": {"file_name": "o.json", "formatting": "sharegpt", "columns": {"messages": "messages"},
                  "tags": {"role_tag": "role", "content_tag": "content", "user_tag": "user",
                           "assistant_tag": "assistant", "system_tag": "system"}}}
    rows = [{"messages": [{"role": "user", "content": "x"}, {"role": "assistant", "content": "y"}]},
            {"messages": [{"role": "assistant", "content": "y"}, {"role": "user", "content": "x"}]},
            "not an object"]
    got = _load(info, "o", rows)
    assert [s.reference for s in got.samples] == ["y"]
    assert got.skipped[0].startswith("o:1: invalid role order") and got.skipped[1] == "o:2: not a JSON object"
    oa = _load({"o": {"file_name": "o.json", "formatting": "openai"}}, "o", rows[:1])
    assert oa.samples[0].reference == "y"


@pytest.mark.parametrize("entry, key", [
    ({"hf_hub_url": "x/y"}, "remote"), ({"file_name": "../etc/passwd"}, "file_name"),
    ({"file_name": "a.json", "ranking": True}, "ranking"), ({"file_name": "a.json", "formatting": "xml"}, "formatting"),
])
def test_entries_not_read_here_are_refused_with_the_reason(entry, key):
    with pytest.raises(UsageError) as e:
        ds.entry({"d": entry}, "d")
    assert key in e.value.message


def test_unknown_dataset_names_what_the_file_defines():
    with pytest.raises(UsageError, match="defines: a, b"):
        ds.entry({"a": {"file_name": "a"}, "b": {"file_name": "b"}}, "c")


def test_rows_are_read_from_a_json_array_or_json_lines_and_bad_json_is_a_usage_error():
    assert ds.parse_rows('[{"a": 1}, {"a": 2}]', "x") == [{"a": 1}, {"a": 2}]
    assert ds.parse_rows('{"a": 1}\n\n{"a": 2}\n', "x") == [{"a": 1}, {"a": 2}]
    with pytest.raises(UsageError, match="line 2"):
        ds.parse_rows('{"a": 1}\n{oops', "x")


def test_dataset_names_split_like_llamafactory():
    assert ds.names_of("a, b,,c") == ["a", "b", "c"] and ds.names_of(["a", " b "]) == ["a", "b"]
    assert ds.names_of(None) == []
