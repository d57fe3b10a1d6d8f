"""What the hardware can do: training FLOPs counted from a model (`flops`) and the
machine's measured or data-sheet peak (`peaks`), which MFU divides by. Below the engine
and bench, which both report MFU."""
