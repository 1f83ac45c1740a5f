import time, pyarrow as pa, statelog, shutil, random
from statelog import *
shutil.rmtree("/tmp/pf2", ignore_errors=True)
job = statelog.open("file:///tmp/pf2")
N=1_000_000; K=100_000
keys = [random.randrange(K) for _ in range(N)]
b = job.backend("x", changelog=False)
st = b.get_state(ValueStateDescriptor("count", pa.int64(), default=0))
sk = b.set_current_key; v = st.value; u = st.update
def T(name, f):
    t=time.perf_counter(); f(); dt=time.perf_counter()-t; print(f"{name}: {dt/N*1e9:.0f} ns/op")
def loop0():
    for k in keys: pass
def loop1():
    for k in keys: sk(k)
def loop2():
    for k in keys: sk(k); v()
def loop3():
    for k in keys: sk(k); u(v()+1)
T("empty", loop0); T("setkey", loop1); T("setkey+value", loop2); T("rmw heap", loop3)
b2 = job.backend("y", changelog=True)
st2 = b2.get_state(ValueStateDescriptor("count", pa.int64(), default=0))
sk = b2.set_current_key; v = st2.value; u = st2.update
T("rmw changelog", loop3)
job.close()
job = statelog.open("file:///tmp/pf2", writer_options=dict(persist_delay=1000, flush_records=10**8, max_buffered_records=10**8))
b3 = job.backend("z", changelog=True)
st3 = b3.get_state(ValueStateDescriptor("count", pa.int64(), default=0))
sk = b3.set_current_key; v = st3.value; u = st3.update
T("rmw changelog no flush", loop3)
t=time.perf_counter(); job.writer.flush(); print("flush all", time.perf_counter()-t)
job.close()
