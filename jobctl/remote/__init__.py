"""Clusters reached over SSH: the paramiko transport, the wire format, the laptop's side."""
