"""``autoplan profile-hardware``: measure this machine and write a DeviceProfile and a Cluster.

``compute`` times GEMMs, memory copies, a tiny kernel and an Adam step in this process; ``collectives``
times gloo/NCCL collectives in spawned processes; ``fit`` (torch-free) turns the raw points into the
profile's fitted fields; ``measure`` ties them together.
"""
