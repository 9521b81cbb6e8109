"""The port an SGLang follower serves its dummy ``/health`` on, claimed and checked on the follower's own node.

SGLang's followers (``--node-rank`` above 0) serve no API, but once their schedulers are ready each starts a
dummy health server on the leader's ``--host``/``--port`` on its own node (sgl-project/sglang,
``python/sglang/srt/entrypoints/engine.py``, ``_launch_subprocesses``: ``if server_args.node_rank >= 1: ...
launch_dummy_health_check_server(server_args.host, server_args.port)``; ``python/sglang/srt/utils``' function runs
uvicorn there). The controller chose and claimed that port on the leader's node only
(:class:`~ddslurm.runtime._ports.PortClaims`): on a follower's node another job's server may hold it, and the
follower then dies after the model is loaded, with uvicorn's "address already in use".

:data:`SGLANG_FOLLOWER_CHECK` is put before :data:`~ddslurm.runtime._server_command.SGLANG_BOOT` in a follower's
``-c`` program: it claims the port on the follower's node as the controller claims the leader's (the same
abstract Unix-domain name, ``ddslurm-port-HOST-PORT``, held for the process's whole life, so that no other
ddslurm job on that node chooses it), test-binds ``HOST:PORT`` as uvicorn binds it (``SO_REUSEADDR``) and exits
with :data:`FOLLOWER_PORT_TAKEN` and a message naming the port when either fails, before SGLang is even
imported. Where the leader's address (``--dist-init-addr``) is one of the follower's node's own, the two ranks
share a host (the local test cluster's nodes do): the port is the leader's own, claimed and bound by it, and
nothing is checked. The program is fixed (no secret, the same every run): it reads all it needs from the
command line.
"""

from __future__ import annotations

from ddslurm.runtime._listeners import PORT_CLAIM

FOLLOWER_PORT_TAKEN = 98
"""The exit status of a follower whose health port is taken on its node (98: Linux's ``EADDRINUSE``); the
controller fails the attempt ``port_unavailable`` (:class:`~ddslurm.runtime._serving.FollowerPortTakenError`)."""

SGLANG_FOLLOWER_CHECK = f"""import socket,sys
def _ddslurm_follower_port():
    a=sys.argv
    host,port=a[a.index('--host')+1],int(a[a.index('--port')+1])
    leader=a[a.index('--dist-init-addr')+1].rpartition(':')[0].strip('[]')
    with socket.socket(socket.AF_INET6 if ':' in leader else socket.AF_INET,socket.SOCK_DGRAM) as s:
        try:
            s.bind((leader,0))
            return None
        except OSError:
            pass
    why='ddslurm: port %d on %s of this node (the leader\\'s --host --port), where this SGLang follower'%(port,host)
    why+=' serves its /health, is '
    claim=socket.socket(socket.AF_UNIX,socket.SOCK_STREAM)
    try:
        claim.bind({PORT_CLAIM!r}%(host,port))
    except OSError:
        claim.close()
        print(why+'claimed by another ddslurm job on this node',file=sys.stderr,flush=True)
        sys.exit({FOLLOWER_PORT_TAKEN})
    with socket.socket(socket.AF_INET6 if ':' in host else socket.AF_INET,socket.SOCK_STREAM) as t:
        t.setsockopt(socket.SOL_SOCKET,socket.SO_REUSEADDR,1)
        try:
            t.bind((host,port))
        except OSError as e:
            print(why+'in use (%s)'%e,file=sys.stderr,flush=True)
            sys.exit({FOLLOWER_PORT_TAKEN})
    return claim
_ddslurm_claim=_ddslurm_follower_port()
"""
"""The start of an SGLang follower's ``-c`` program (the module's docstring says what it does): it keeps its claim
in a global of ``__main__``, which lives as long as the process."""
