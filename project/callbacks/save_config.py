"""`LoggerSaveConfigCallback`: the run's config as given, saved beside it and recorded in every logger."""

from pathlib import Path
from typing import Any

import yaml
from lightning.pytorch.cli import SaveConfigCallback

from project.atomic_files import atomic_write_text
from project.redaction import redact_config


class LoggerSaveConfigCallback(SaveConfigCallback):
    """Saves the resolved config next to the run (config.yaml, atomically) and records it in every logger (W&B's
    run config, the CSV logger's hparams.yaml), with its secrets (passwords in URLs, settings named like a
    secret) as `***`: a rerun from config.yaml takes them again from the command line or the environment."""

    def setup(self, trainer: Any, pl_module: Any, stage: str) -> None:
        if not self.already_saved:
            log_dir = trainer.log_dir  # a collective (broadcast from rank 0): every rank asks
            if trainer.is_global_zero:
                # The config as parsed (and validated then): a validating dump would check it all over again.
                text = self.parser.dump(self.config, skip_unset=False, skip_validation=True)
                plain = yaml.safe_load(text)
                if (redacted := redact_config(plain)) != plain:
                    text = yaml.safe_dump(
                        redacted, sort_keys=False, allow_unicode=True, default_flow_style=False
                    )
                atomic_write_text(Path(log_dir) / self.config_filename, text)
        super().setup(trainer, pl_module, stage)  # (built with save_to_log_dir=False: the loggers' copy only)

    def save_config(self, trainer: Any, pl_module: Any, stage: str) -> None:
        config = redact_config(self.config.as_dict())
        for logger in trainer.loggers:
            logger.log_hyperparams(config)
