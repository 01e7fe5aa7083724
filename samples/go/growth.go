// A recursion that grows its goroutine's stack: each time the stack is too
// small, Go's prologue calls morestack, which copies the stack and restarts the
// function from its entry, so an entry probe on descend sees that call twice,
// while it returns once. The program prints its own count of calls.
//
// usage: growth [DEPTH [ROUNDS]]
package main

import (
	"fmt"
	"os"
	"strconv"
)

var calls int

//go:noinline
func descend(n int) int {
	calls++
	var pad [64]int // a frame big enough to grow the stack now and then
	pad[n%64] = n
	if n == 0 {
		return pad[0]
	}
	return descend(n-1) + pad[n%64]
}

func arg(i, def int) int {
	if len(os.Args) > i {
		if v, err := strconv.Atoi(os.Args[i]); err == nil {
			return v
		}
	}
	return def
}

func main() {
	depth, rounds := arg(1, 5000), arg(2, 20)
	sum := 0
	for r := 0; r < rounds; r++ {
		done := make(chan int)
		go func() { done <- descend(depth) }() // a new goroutine: a small stack again
		sum += <-done
	}
	fmt.Printf("calls=%d sum=%d\n", calls, sum)
}
