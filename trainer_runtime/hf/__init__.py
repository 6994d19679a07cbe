"""HF transformers Trainer integration: `KubeckptCallback`, `kubeckpt_trainer`, `resume_checkpoint`.

transformers is imported only inside this package (and torch only through it).
"""

from .callback import KubeckptCallback, kubeckpt_trainer, resume_checkpoint

__all__ = ["KubeckptCallback", "kubeckpt_trainer", "resume_checkpoint"]
