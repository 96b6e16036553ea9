"""Configuration: the pipeline's own settings (``sections``), the strict YAML-to-dataclass loader
and its ``ConfigError`` (``build``) and the table that answers TRL and verl key names
(``foreign_keys``). The run configuration composing every package's settings is
``railgate.config.RunConfig``."""
