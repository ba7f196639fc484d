# scripts/dynamo-raise-probe.py - what text survives an exception raised
# inside a torch.compile(fullgraph=True) region (run on the GPU machine,
# where torch is: python3 scripts/dynamo-raise-probe.py). Session 31: a
# builtin exception and torch._check keep their text; a dcpx error class,
# whose __init__ calls super().__init__, cannot be built by Dynamo.
import torch
print(torch.__version__)
def chk_rt(s):
    if s is not None:
        raise RuntimeError("push(stream=...) under torch.compile: current stream")
def chk_check(s):
    torch._check(s is None, lambda: "push(stream=...) under torch.compile: current stream")
class E(RuntimeError):
    pass
def chk_sub(s):
    if s is not None:
        raise E("push(stream=...) under torch.compile: current stream")
for name, fn in [("runtime", chk_rt), ("check", chk_check), ("subclass-noinit", chk_sub)]:
    def body(x, fn=fn):
        fn(7)
        return x + 1
    f = torch.compile(body, fullgraph=True, backend="eager")
    try:
        f(torch.zeros(2))
        print(name, "no error")
    except Exception as e:
        print(name, type(e).__name__, "current stream" in str(e), str(e)[:200].replace("\n", " | "))
    torch._dynamo.reset()
