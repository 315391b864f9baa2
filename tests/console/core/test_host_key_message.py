"""The host-key refusal names what was actually checked (issue 33, item 9): for an ssh_config alias with
its own HostName, Port and UserKnownHostsFile, that file and port, not ~/.ssh/known_hosts and port 22."""

from __future__ import annotations

import pytest

from console.core import ssh
from console.core.options import ConnectOptions
from tests.support.devhost import devhost_thread

pytestmark = pytest.mark.e2e


async def test_the_refusal_names_the_known_hosts_file_and_port_of_an_ssh_config_alias(tmp_path):
    with devhost_thread(tmp_path / "dh") as h:
        d = h.host
        kh = tmp_path / "rig_known_hosts"
        kh.write_text("")  # the key is unknown to the file the alias names
        cfg = tmp_path / "ssh_config"
        cfg.write_text(
            f"Host rig\n  HostName 127.0.0.1\n  Port {d.port}\n  User {d.user}\n"
            f"  IdentityFile {d.client_key_path}\n  UserKnownHostsFile {kh}\n"
        )
        with pytest.raises(ssh.HostKeyRefused) as e:
            await ssh.connect(ConnectOptions(host="rig", config_files=[str(cfg)]))
    msg = str(e.value)
    assert f"host key of [127.0.0.1]:{d.port} (rig) is not trusted" in msg, msg
    assert f"differs from {kh};" in msg and f"`ssh-keyscan -p {d.port} 127.0.0.1 >> {kh}`" in msg, msg
    assert "~/.ssh/known_hosts" not in msg and "-p 22 " not in msg
    assert d.host_fingerprint in msg  # fetched from the port actually used
