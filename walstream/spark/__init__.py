"""The Spark side: the streaming source, decoding on executors."""
