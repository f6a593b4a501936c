"""Reading HTTP/1.1 responses back as a client would, with h11 (an HTTP/1.1 parser of its
own, not the proxy's): what the egress tests check the proxy's framing with."""

from __future__ import annotations

import h11

__all__ = ["Response", "read_responses"]

Response = tuple[int, dict[str, str], bytes, dict[str, str]]


def read_responses(data: bytes, methods: list[str]) -> list[Response]:
    """The responses in `data` as a client reads them, request after request: status,
    headers, body, trailers (interim responses with an empty body)."""
    client = h11.Connection(h11.CLIENT)
    client.receive_data(data)
    responses: list[Response] = []
    for method in methods:
        client.send(h11.Request(method=method, target="/", headers=[("Host", "api.test")]))
        client.send(h11.EndOfMessage())
        body = b""
        while not isinstance(event := client.next_event(), h11.EndOfMessage):
            if event is h11.NEED_DATA:
                client.receive_data(b"")  # the end of the connection
            elif isinstance(event, h11.InformationalResponse | h11.Response):
                responses.append((event.status_code, {k.decode(): v.decode() for k, v in event.headers}, b"", {}))
            elif isinstance(event, h11.Data):
                body += event.data
            else:
                raise AssertionError(f"unexpected {event!r}")
        status, headers, _, _ = responses[-1]
        responses[-1] = (status, headers, body, {k.decode(): v.decode() for k, v in event.headers})
        if client.their_state is h11.DONE:
            client.start_next_cycle()
    return responses
