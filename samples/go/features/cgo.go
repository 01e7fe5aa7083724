//go:build cgo

// With cgo, the program links the C library: its threads start in C, and its
// calls into C switch stacks (asmcgocall, systemstack_switch).
package main

// static int twice(int x) { return 2 * x; }
import "C"

func init() { cgoTwice = func(x int) int { return int(C.twice(C.int(x))) } }
