"""Drive a remote (NDIF) capture up to the network request, in a fresh process.

Run with ``HF_HOME`` pointing at a cache that holds ``interp-test/tiny`` and ``HF_HUB_OFFLINE=1``.
The hub lookup nnsight makes to canonicalize the repo id is answered from its cache, and the
request itself is intercepted: the script prints the model key and the sites the request carried.
"""

import json

import nnsight.modeling.huggingface as hf_envoys
from nnsight.intervention.backends import remote

import interp


class RequestReached(Exception):
    pass


def main():
    model = interp.load_model("interp-test/tiny", backend="nnsight", remote=True)
    hf_envoys._ID_CACHE["interp-test/tiny"] = "interp-test/tiny"  # the hub's answer, without a network
    seen = {}

    def intercept(self, request, tracer):
        seen["model_key"] = self.model_key
        seen["bytes"] = len(self._serialize(tracer))
        raise RequestReached

    remote.RemoteBackend.request = intercept
    try:
        model.read(["t1 t2 t3"], ["blocks.0.hook_resid_post", "blocks.1.attn.hook_z"])
    except RequestReached:
        print(json.dumps({"reached": True, "device": str(model.device), **seen}))
        return
    print(json.dumps({"reached": False}))


if __name__ == "__main__":
    main()
