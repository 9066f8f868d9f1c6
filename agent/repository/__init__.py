"""What a Triton model repository on disk says: layout and version folders, config.pbtxt,
auto-complete against the model file, warm-up samples, and the poll-mode watcher."""
