"""Operations: ``cli``, ``config``, ``observe`` (logging and stats), ``metrics``, ``incidents``,
``demo``."""
