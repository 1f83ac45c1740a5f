import time, pyarrow as pa, statelog, shutil, random
from statelog import *
shutil.rmtree("/tmp/pf", ignore_errors=True)
job = statelog.open("file:///tmp/pf")
N=1_000_000; K=100_000
keys = [random.randrange(K) for _ in range(N)]
for changelog in (False, True):
    b = job.backend(f"c{changelog}", changelog=changelog)
    st = b.get_state(ValueStateDescriptor("count", pa.int64(), default=0))
    t=time.perf_counter()
    sk = b.set_current_key; v = st.value; u = st.update
    for k in keys:
        sk(k); u(v()+1)
    dt=time.perf_counter()-t
    if changelog:
        job.writer.flush(); dt2 = time.perf_counter()-t
        print("changelog", N/dt, "incl flush", N/dt2, job.writer.bytes_uploaded, job.writer.segments_uploaded)
    else:
        print("heap", N/dt)
job.close()
