"""Deployment: ``eatta-serve``, a model that adapts while it serves the Open Inference Protocol.

One file a concept: :mod:`~eatta.serve.protocol` (the KServe v2 / Triton REST messages),
:mod:`~eatta.serve.batcher` (single requests gathered into batches), :mod:`~eatta.serve.snapshot`
(what serves, one consistent copy), :mod:`~eatta.serve.adapter` (the thread that steps the
method), :mod:`~eatta.serve.origins` (which request and row a label request's sample came from),
:mod:`~eatta.serve.state` (the checkpoint and the label queue under ``--state``),
:mod:`~eatta.serve.metrics` (Prometheus text), :mod:`~eatta.serve.service` (all of them for one
model), :mod:`~eatta.serve.app` (the HTTP routes, the labelling page beside them),
:mod:`~eatta.serve.model` (``--model`` and the packaged demo) and :mod:`~eatta.serve.cli`.
Starlette and uvicorn are needed (``pip install 'eatta[serve]'``); nothing here is imported by
``import eatta``.
"""
