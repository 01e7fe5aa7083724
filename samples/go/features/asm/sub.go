// Package asm holds a function written in Go's assembly (its own package: Go
// builds no Go assembly in a package that uses cgo, as the program's main can).
package asm

// Sub returns a - b. Its body is sub_amd64.s or sub_arm64.s: Go's ABI0, its
// arguments and result on the stack.
func Sub(a, b int) int
