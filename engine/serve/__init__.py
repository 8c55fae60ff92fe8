"""``isan-serve``: HTTP and WebSocket scoring with continuous batching (the ``serve`` extra).

* :mod:`~isan.engine.serve.config`: the limits (:class:`ServeConfig`);
* :mod:`~isan.engine.serve.schemas`: request and response schemas (pydantic, the OpenAPI schema);
* :mod:`~isan.engine.serve.scheduler`: the batching scheduler (rounds of ``Engine.score_batch``);
* :mod:`~isan.engine.serve.budget`: the memory bound; :mod:`~isan.engine.serve.snapshot`: signed states;
* :mod:`~isan.engine.serve.service`: one request from its parsed form to its answer;
  :mod:`~isan.engine.serve.completions`: the OpenAI-compatible API;
* :mod:`~isan.engine.serve.app`: the ASGI app (:func:`create_app` puts the rest together);
  :mod:`~isan.engine.serve.routes`: the HTTP routes (thin: parse, hand off to the service);
  :mod:`~isan.engine.serve.asgi`: bodies, answers and errors of those routes;
  :mod:`~isan.engine.serve.websocket`: ``/v1/stream``; :mod:`~isan.engine.serve.openapi`: the schema's
  declarations; :mod:`~isan.engine.serve.access`: the API key, Host and Origin checks;
* :mod:`~isan.engine.serve.connections`: the header deadline and connection cap uvicorn lacks;
* :mod:`~isan.engine.serve.cli`: ``isan-serve``; :mod:`~isan.engine.serve.workers`: ``--workers N``;
* :mod:`~isan.engine.serve.client`: a ``/v1/stream`` client that resumes on another replica from its
  last snapshot;
* :mod:`~isan.engine.serve.sampling`: sampling in pieces (``/v1/sample`` as Server-Sent Events);
* :mod:`~isan.engine.serve.docs`: ``/docs``, rendered from the schema without scripts or a CDN;
* :mod:`~isan.bench.serve`: the load benchmark behind ``isan bench serve``.

Importing this package needs only click; :func:`create_app` imports FastAPI.
"""

from isan.engine.serve.config import DEFAULT_MAX_CHARS, ServeConfig  # noqa: F401


def create_app(engine=None, max_chars: int = DEFAULT_MAX_CHARS, config: ServeConfig | None = None, **kwargs):
    """The ASGI app (see :func:`isan.engine.serve.app.create_app`)."""
    from isan.engine.serve.app import create_app as _create

    return _create(engine, max_chars=max_chars, config=config, **kwargs)


def main(*args, **kwargs):
    from isan.engine.serve.cli import main as _main

    return _main(*args, **kwargs)


__all__ = ["DEFAULT_MAX_CHARS", "ServeConfig", "create_app", "main"]
