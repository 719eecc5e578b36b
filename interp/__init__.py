"""interp: hook-based activation capture and the analyses built on it.

>>> import interp
>>> model = interp.load_model("world")                      # the embedded default
>>> acts = interp.capture(model, ["Vorn Kallit lives in"], sites=model.sites[:3])
"""

from .attention import attention_patterns
from .backends import BACKENDS, DEFAULT_BACKEND
from .capture import Activations, capture
from .lens import LogitLensError, logit_lens
from .models import Model, ModelNotFoundError, load_model, register_model, registered_models
from .prompts import Prompt
from .sae import SAEFormatError, SparseAutoencoder, load_sae
from .sae_sites import attach_sae, feature_site
from .sites import UnknownSiteError
from .store import ActivationStore
from .tokens import PositionError, SubjectNotFoundError

__version__ = "0.1.0"

__all__ = [
    "BACKENDS",
    "DEFAULT_BACKEND",
    "register_model",
    "registered_models",
    "Activations",
    "ActivationStore",
    "Model",
    "ModelNotFoundError",
    "PositionError",
    "Prompt",
    "SubjectNotFoundError",
    "UnknownSiteError",
    "capture",
    "attach_sae",
    "feature_site",
    "load_sae",
    "SAEFormatError",
    "SparseAutoencoder",
    "load_model",
    "logit_lens",
    "attention_patterns",
    "LogitLensError",
]
