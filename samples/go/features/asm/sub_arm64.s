#include "textflag.h"

// func Sub(a, b int) int: ABI0, a+0(FP) and b+8(FP) in, ret+16(FP) out.
TEXT ·Sub(SB), NOSPLIT, $0-24
	MOVD a+0(FP), R0
	MOVD b+8(FP), R1
	SUB R1, R0, R0
	MOVD R0, ret+16(FP)
	RET
