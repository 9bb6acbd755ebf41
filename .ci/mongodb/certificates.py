"""Make a throwaway certificate authority and a server certificate for localhost, for the workflow's
TLS job (tls.yml), with trustme (the dev extra).

    python .ci/mongodb/certificates.py DIRECTORY

Writes DIRECTORY/ca.pem (the authority, which clients verify the server with) and
DIRECTORY/server.pem (the server's certificate for localhost and 127.0.0.1 followed by its key, as
mongod's --tlsCertificateKeyFile wants them), readable by everyone: mongod in its container runs as
its own user, and nothing here is secret beyond the job.
"""

from __future__ import annotations

import sys
from pathlib import Path

import trustme


def main(directory: Path) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    authority = trustme.CA()
    server = authority.issue_cert("localhost", "127.0.0.1")
    authority.cert_pem.write_to_path(str(directory / "ca.pem"))
    server.private_key_and_cert_chain_pem.write_to_path(str(directory / "server.pem"))
    for name in ("ca.pem", "server.pem"):
        (directory / name).chmod(0o644)
    print(f"certificates: {directory / 'ca.pem'}, {directory / 'server.pem'}", flush=True)


if __name__ == "__main__":
    if len(sys.argv) != 2:
        raise SystemExit(__doc__)
    main(Path(sys.argv[1]))
