"""The engine: what walstream needs of Spark beside its own stages (DataFrames from the JVM,
Spark SQL text made from the config)."""
