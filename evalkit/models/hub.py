"""Is the Hugging Face hub usable right now? One short probe instead of a minute of retries.

Without the network, ``huggingface_hub`` and ``datasets`` retry each request with back-off
("Retrying in Ns") for about a minute before they fail. Model loading (``evalkit.models.loading``) and
lm-eval task loading (``evalkit.evals.lmeval.adapter``) ask here first: offline mode set by the user
(``HF_HUB_OFFLINE=1`` or ``HF_DATASETS_OFFLINE=1``) counts as unreachable without a probe, else
one TCP connection to the hub's host decides, name lookup included, within a short timeout.
"""

from __future__ import annotations

import os
import socket
import sys
import threading
from urllib.parse import urlparse

_TRUE = ("1", "ON", "YES", "TRUE")


def offline_mode() -> bool:
    """True when the user (or evalkit, for a scoped call) put huggingface_hub or datasets offline."""
    from huggingface_hub import constants

    if constants.HF_HUB_OFFLINE:
        return True
    datasets = sys.modules.get("datasets")  # its own flag, which evalkit's lm-eval path may set
    if datasets is not None:
        return bool(datasets.config.HF_HUB_OFFLINE)
    return os.environ.get("HF_DATASETS_OFFLINE", "").upper() in _TRUE


def hub_reachable(timeout: float = 3.0) -> bool:
    """False when offline mode is set or the hub's host cannot be reached within ``timeout`` seconds."""
    if offline_mode():
        return False
    from huggingface_hub import constants

    url = urlparse(constants.ENDPOINT)
    answer: list[bool] = []

    def probe():  # in a thread: the socket timeout does not bound the name lookup
        try:
            with socket.create_connection((url.hostname, url.port or 443), timeout=timeout):
                answer.append(True)
        except OSError:
            answer.append(False)

    thread = threading.Thread(target=probe, name="evalkit-hub-probe", daemon=True)
    thread.start()
    thread.join(timeout)
    return bool(answer and answer[0])
