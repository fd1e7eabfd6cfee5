"""Pretrained weights that cannot be downloaded: one line at once, naming the way that works without a network.

A network asked for pretrained weights downloads them on first use (torchvision from download.pytorch.org,
timm from the Hugging Face hub), then reads them from its cache. Without a network that first download fails
deep inside a library (after its own retries, for the hub), as a traceback that does not say what to do.
"""

import os
import socket
from urllib.parse import urlparse

from project.errors import UserError

#: What a failed download raises: no connection, a name that does not resolve, an HTTP error, a missing file.
DOWNLOAD_ERRORS: tuple[type[BaseException], ...] = (OSError,)


def unreachable(url: str) -> bool:
    """Whether the host of `url` is known not to be reachable: its name does not resolve and no proxy would
    resolve it for this process (then a download cannot succeed, and need not be tried)."""
    proxies = ("HTTPS_PROXY", "https_proxy", "ALL_PROXY", "all_proxy")
    host = urlparse(url).hostname
    if not host or any(os.environ.get(name) for name in proxies):
        return False
    try:
        socket.getaddrinfo(host, 443)
    except socket.gaierror:
        return True
    return False


def download_failed(owner: str, name: str, error: BaseException | str, without: str) -> UserError:
    """The line for pretrained weights of `name` that could not be downloaded (`error`); `without` is the
    setting that trains from scratch instead."""
    reason = (
        error if isinstance(error, str) else f"{type(error).__name__}: {str(error).splitlines()[0][:200]}"
    )
    return UserError(
        f"{owner}: could not download the pretrained weights of {name!r} ({reason}). Without a network, "
        "download them once where there is one and give the file with --model.net.init_args.weights_file PATH "
        f"(a .safetensors or .pth state dict), or train from scratch with {without}"
    )
