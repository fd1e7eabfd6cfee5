"""Streaming: image datasets as litdata chunks, in a local folder or object storage, for data beyond one disk and
runs over many nodes.

`prepare` (the command) reads any source that lists its samples and writes its splits as chunks with their
metadata; `StreamingImageDataModule` (`source`) trains on them, each process and loader worker reading its own
share. litdata is an optional extra, imported only when chunks are read or written.
"""

#: What this package adds to the core's seams (project.registry reads it without importing the package).
REGISTER = {
    "commands": {"prepare": (".prepare:main", "convert image files into litdata chunks for streaming")}
}
