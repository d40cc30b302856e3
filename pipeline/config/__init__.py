"""All callqa settings in one typed object.

Every setting is a field with its default, its environment variable (``CALLQA_<FIELD>``, upper case)
and a one-line description. Values come, in order of precedence, from: keyword arguments, environment
variables, a ``.env`` file, and the TOML file named by ``CALLQA_CONFIG`` (default ``callqa.toml`` in the
working directory, if present). ``callqa settings`` prints the table.

Each concern keeps its fields in its own module (``config/broker.py``, ``config/asr.py``, ...); this
module composes them into one flat ``Settings`` class so env names stay short and flat.
"""

from __future__ import annotations

import os
from functools import lru_cache
from pathlib import Path

from pydantic_settings import (
    BaseSettings,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
    TomlConfigSettingsSource,
)

from pipeline.config.asr import AsrSettings
from pipeline.config.broker import BrokerSettings
from pipeline.config.gateway import GatewaySettings
from pipeline.config.live import LiveSettings
from pipeline.config.notify import NotifySettings
from pipeline.config.postcall import PostCallSettings
from pipeline.config.qa import QaSettings
from pipeline.config.recordings import RecordingSettings
from pipeline.config.segmentation import SegmentationSettings
from pipeline.config.siprec import SiprecSettings
from pipeline.config.store import StoreSettings
from pipeline.config.topics import TopicSettings
from pipeline.config.worker import WorkerSettings

ENV_PREFIX = "CALLQA_"


class Settings(
    BrokerSettings,
    TopicSettings,
    AsrSettings,
    SegmentationSettings,
    WorkerSettings,
    StoreSettings,
    QaSettings,
    GatewaySettings,
    SiprecSettings,
    PostCallSettings,
    RecordingSettings,
    LiveSettings,
    NotifySettings,
    BaseSettings,
):
    model_config = SettingsConfigDict(
        env_prefix=ENV_PREFIX,
        env_file=".env",
        extra="ignore",
        validate_default=True,
        # A validation error must not echo what it was given: the input holds the secrets too.
        hide_input_in_errors=True,
    )

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        toml_path = Path(os.environ.get(f"{ENV_PREFIX}CONFIG", "callqa.toml"))
        return (
            init_settings,
            env_settings,
            dotenv_settings,
            TomlConfigSettingsSource(settings_cls, toml_file=toml_path),
        )

    @property
    def recordings_location(self) -> str:
        """Where recordings are kept: ``recordings_url``, or ``<state_dir>/recordings``."""
        return self.recordings_url or str(self.state_dir / "recordings")

    def describe(self) -> list[tuple[str, str, str, str]]:
        """(env var, current value, default, description) for every setting."""
        rows = []
        for name, field in type(self).model_fields.items():
            rows.append(
                (
                    f"{ENV_PREFIX}{name.upper()}",
                    repr(getattr(self, name)),
                    repr(field.default),
                    field.description or "",
                )
            )
        return rows


@lru_cache(maxsize=1)
def get_settings() -> Settings:
    """The process-wide settings, read once."""
    return Settings()


__all__ = ["ENV_PREFIX", "Settings", "get_settings"]
