"""Names the dead-code check (tests/unit/test_dead_code.py, vulture) may not see used: each is used by a
framework or written as data. Add a name only with the reason; a name that is really unused goes, not here."""
# ruff: noqa: B018, F821

# signal handlers' (signum, frame) signature
_.signum
# transformers' TrainerCallback hooks (agent/lf_entry.py), called by the Trainer
_.on_train_begin, _.on_step_begin, _.on_step_end, _.on_log, _.on_train_end
# HF config / tokenizer attributes set for the files they save (agent/tiny.py, agent/stack_judge.py)
_.pre_tokenizer, _.decoder, _.chat_template, _.architectures, _.eos_token_id
# typer/click and http.server overrides; tarfile.TarInfo fields; ruamel.yaml settings
_.display_type_rich, _.__class__, _.log_message, _.gid
_.allow_duplicate_keys, _.Representer, _.default_flow_style, _.sort_base_mapping_type_on_output
# module __getattr__ (PEP 562): connectors load pyinfra lazily
_.__getattr__
# pydantic / dataclass fields kept as data: written into facts.json, doctor --json and run records, read by people
_.amx_int8, _.amx_bf16, _.xtiledata_os, _.permission_errno, _.avx512_vnni_exec, _.swap_total_bytes
_.hugepages_total, _.hugepage_size_bytes, _.default_runtime, _.cgroup_driver, _.security_options, _.dmi_product
_.memlock_hard, _.shm_free_bytes, _.schema_version, _.finished_at, _.num_threads, _.elapsed_time
# event fields (core/events.py) read through dataclasses.fields() into events.jsonl, or by the renderer's
# templates (cli/events_view.py: "{e.status_file}")
_.status_file, _.failed_checks, _.seconds_after_submit, _.slurm_job
# status.json keys typed by core/run_record.RunStatus, read by their string key (st["stop_reason"], .get("schema"))
_.serve_container, _.failed_stage, _.stop_reason, _.updated, _.schema, _.down_at, _.slurm_request
# kt-kernel's C++ config objects (agent/prepare_weights.py): pybind11 fields the quantizer reads when it runs
_.subpool_count, _.subpool_numa_map, _.subpool_thread_count, _.layer_idx, _.max_len, _.gate_proj, _.up_proj
# prepare-weights' summary fields: written by --json and read by people and bench/gpu/formats.py
_.source_format
# the model skeleton's config, as from_pretrained sets it: kt-kernel's wrapper reads model.config.name_or_path
# (agent/stack_skeleton.py)
_.name_or_path
