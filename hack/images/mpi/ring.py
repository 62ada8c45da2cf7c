"""A token ring over every MPI rank: rank 0 starts a list, each rank appends its hostname and passes
it on, and rank 0 prints the list that came back, so one line proves that every rank ran and that
each one talked to the next (the cluster test greps for `ring ok`)."""
import socket
import sys

from mpi4py import MPI

comm = MPI.COMM_WORLD
rank, size = comm.Get_rank(), comm.Get_size()
host = socket.gethostname()
print(f"rank {rank}/{size} on {host}", flush=True)
if size == 1:
    print(f"ring ok size=1 hosts={host}", flush=True)
    sys.exit(0)
if rank == 0:
    comm.send([host], dest=1, tag=7)
    token = comm.recv(source=size - 1, tag=7)
    assert len(token) == size, token
    print(f"ring ok size={size} hosts={','.join(token)}", flush=True)
else:
    token = comm.recv(source=rank - 1, tag=7)
    comm.send(token + [host], dest=(rank + 1) % size, tag=7)
comm.Barrier()
