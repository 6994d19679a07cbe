"""Peer copies of the ramdisk tier (the policy's `localTier.peerCopy`).

Each node's coordinator (the process that commits the node's local checkpoint) also keeps the
newest local checkpoint of its ring predecessor in its own ramdisk, under `<ramdisk>/peers/<i>/`,
and serves it back over HTTP: a replacement pod, whose ramdisk is empty, fetches its copy from its
ring successor instead of reading the persistent tier. The pieces, each small:

    ring.py      pure: node indices, the ring, what each node fetches from whom, the room check
    store.py     the receiver's directory: partial copies, checked by content, made complete
    server.py    the HTTP server in front of the store (a per-job token on every request)
    client.py    the sender's push thread and the fetch a restore makes
    service.py   the wiring into the save protocol: setup (collectives), push, recover
"""
