"""What a run's evaluation talks to and reads (pure): the served model names, the URL the controller reaches the
server at, and where the evaluation set lies on the host."""

from __future__ import annotations

import ipaddress
import posixpath
from dataclasses import dataclass

from ktdeploy.core.errors import RecipeError
from ktdeploy.core.eval.dataset import DATA_CONFIG, names_of
from ktdeploy.core.eval.split import HOLDOUT_SUFFIX
from ktdeploy.core.job_layout import JobLayout
from ktdeploy.core.recipe.document import Recipe

LOOPBACK_NAMES = ("localhost", "localhost.localdomain", "ip6-localhost")


def served_model(recipe: Recipe) -> str:
    """The model name the server answers to: deploy.serve.served_model_name, else the base model folder's name."""
    deploy = recipe.require_deploy()
    mp = recipe.keys.model_name_or_path
    return deploy.serve.served_model_name or (posixpath.basename(str(mp).rstrip("/")) if mp else "model")


@dataclass(frozen=True)
class Models:
    tuned: str
    base: str | None          # None: this server does not serve the base (base_why says why)
    base_why: str = ""


def models(recipe: Recipe) -> Models:
    """LoRA served by sglang-kt: the adapter is ``<served>:<lora_name>``, the base ``<served>`` on the same server.
    A merged model or a full fine-tune replaces the base: no base on that server."""
    deploy = recipe.require_deploy()
    served = served_model(recipe)
    if recipe.keys.is_full:
        return Models(served, None, "a full fine-tune is served in place of the base")
    if deploy.serve.merge:
        return Models(served, None, "deploy.serve.merge serves the merged model in place of the base")
    return Models(f"{served}:{deploy.serve.lora_name}", served)


def _loopback(host: str) -> bool:
    if host.lower() in LOOPBACK_NAMES:
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def _unspecified(host: str) -> bool:
    try:
        return ipaddress.ip_address(host.strip("[]")).is_unspecified
    except ValueError:
        return False


def _url(host: str, port: int) -> str:
    h = f"[{host}]" if ":" in host and not host.startswith("[") else host
    return f"http://{h}:{port}/v1"


def controller_url(recipe: Recipe, *, local: bool, host_address: str) -> tuple[str | None, str]:
    """(the URL this machine reaches the server at, or None; why not). ``local``: the host is this machine;
    ``host_address``: the SSH host's address. A server that listens on the host's loopback is out of reach from
    another machine (never this machine's own loopback: that would be another server)."""
    serve = recipe.require_deploy().serve
    h, port = serve.host, serve.port
    if local:
        return _url("127.0.0.1" if _unspecified(h) else h, port), ""
    if _loopback(h):
        return None, (f"the server listens on {h} of the host, which this machine cannot reach; forward it "
                      f"(ssh -N -L {port}:127.0.0.1:{port} HOST) and run `ktdeploy eval RUN --endpoint "
                      f"http://127.0.0.1:{port}/v1`, or serve on an address this machine reaches (deploy.serve.host)")
    return _url(host_address if _unspecified(h) else h, port), ""


@dataclass(frozen=True)
class EvalData:
    """Where the evaluation set lies on the host: a folder with a dataset_info.json and the datasets to read."""

    data_dir: str
    datasets: tuple[str, ...]
    source: str               # "holdout" | "deploy.eval.dataset" | "train.eval_dataset"

    @property
    def info(self) -> str:
        return posixpath.join(self.data_dir, DATA_CONFIG)


def holdout_dir(recipe: Recipe) -> str:
    return JobLayout(str(recipe.keys.output_dir)).holdout_dir


def eval_data(recipe: Recipe) -> EvalData:
    """The evaluation set of ``deploy.eval``: the holdout's part when it is set, else deploy.eval.dataset, else
    LlamaFactory's own train.eval_dataset (all in train.dataset_dir); RecipeError when there is none."""
    ev = recipe.require_deploy().eval
    data_dir = recipe.train.get("dataset_dir")
    if ev is not None and ev.holdout:
        names = names_of(recipe.train.get("dataset"))
        return EvalData(holdout_dir(recipe), tuple(n + HOLDOUT_SUFFIX for n in names), "holdout")
    if not isinstance(data_dir, str) or not data_dir.startswith("/"):
        raise RecipeError("the evaluation reads its dataset from train.dataset_dir, which is not an absolute path",
                          key="train.dataset_dir", fix="Set train.dataset_dir to the data folder (deploy.volumes.data).")
    if ev is not None and ev.dataset:
        return EvalData(data_dir, (ev.dataset,), "deploy.eval.dataset")
    names = names_of(recipe.train.get("eval_dataset"))
    if names:
        return EvalData(data_dir, tuple(names), "train.eval_dataset")
    raise RecipeError("deploy.eval has no evaluation set", key="deploy.eval",
                      fix="Set deploy.eval.holdout (e.g. 0.05: held out of the training data before training), "
                          "deploy.eval.dataset, or LlamaFactory's train.eval_dataset.")
