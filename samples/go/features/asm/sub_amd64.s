#include "textflag.h"

// func Sub(a, b int) int: ABI0, a+0(FP) and b+8(FP) in, ret+16(FP) out.
TEXT ·Sub(SB), NOSPLIT, $0-24
	MOVQ a+0(FP), AX
	SUBQ b+8(FP), AX
	MOVQ AX, ret+16(FP)
	RET
