"""`gpumon serve`: a read-only live web page of this machine's cards or a fleet's.

- `address`: what `--listen` means, and whether an address is reachable beyond this machine.
- `auth`: the access token (made once, kept 0600) and the checks every request passes.
- `view`: the page's document (cards, verdicts, free cards, processes), made from snapshots.
- `feed`: one sampler or fleet, and the latest view, sent to every open page (Server-Sent Events).
- `server`: the routes (GET only) and the server's life (TLS, start, clean stop).
- `assets/`: the page itself (HTML without data, a script that only sets text, a style sheet).

Views layer: it reads cards/, fleet/, owners/, health/ and jobs/ (which card is free), never
Textual; aiohttp is imported only here, so other commands never load it.
"""
