"""ktdeploy: a checked path from a recipe to a KTransformers + LlamaFactory fine-tune and its server."""

from ktdeploy.core.errors import (
    CheckFailed,
    ConnectError,
    ImageError,
    KtdeployError,
    RecipeError,
    RunRecordError,
    StackUnavailable,
    StepError,
    UsageError,
)

__version__ = "0.1.0"

__all__ = [
    "CheckFailed",
    "ConnectError",
    "ImageError",
    "KtdeployError",
    "RecipeError",
    "RunRecordError",
    "StackUnavailable",
    "StepError",
    "UsageError",
    "__version__",
]
