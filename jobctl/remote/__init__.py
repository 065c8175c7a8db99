"""Clusters reached over SSH: the paramiko transport (ssh, keys, sshconfig), files and tree sync
over it (files, sync), the wire format (protocol), the laptop's side (client, bootstrap)."""
