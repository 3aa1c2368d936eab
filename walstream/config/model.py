"""The whole walstream.yaml, validated: every section, and the references between them."""

from __future__ import annotations

from pydantic import Field

from walstream.config.sections import (
    EventsConfig,
    ServerConfig,
    SourceConfig,
    SparkConfig,
    StateConfig,
)
from walstream.config.sink import SinkConfig
from walstream.fields import Model


class Config(Model):
    """walstream.yaml as written (validated, frozen); `resolve()` turns it into a Plan."""

    state: StateConfig = StateConfig.model_validate({})
    spark: SparkConfig = Field(default_factory=lambda: SparkConfig.model_validate({}))
    server: ServerConfig = Field(default_factory=lambda: ServerConfig.model_validate({}))
    events: EventsConfig | None = None
    sources: list[SourceConfig] = Field(min_length=1)
    sinks: list[SinkConfig] = Field(min_length=1)

    @property
    def state_dsn(self) -> str:
        """Where walstream keeps its state: `state.dsn`, else the first source's database
        (its primary, when the source reads a standby)."""
        return self.state.dsn.get_secret_value() if self.state.dsn else self.sources[0].writes_dsn
