// Goroutines on several threads call work a known number of times; the
// program prints its own count of calls, to compare with urewrite's.
//
// usage: workers [GOROUTINES [CALLS_EACH [LOCKED]]]
// LOCKED 1: each goroutine keeps a thread of its own (runtime.LockOSThread), so
// that the calls are spread over several threads whatever the scheduler does.
package main

import (
	"fmt"
	"os"
	"runtime"
	"strconv"
	"sync"
	"sync/atomic"
)

var calls atomic.Int64

// nosplit: no stack check, so no morestack restarts work's entry (entry hits = calls)
//
//go:noinline
//go:nosplit
func work(n int) int {
	calls.Add(1)
	s := 0
	for i := 0; i < n%7; i++ {
		s += i * n
	}
	if n%64 == 0 {
		runtime.Gosched() // mid-call: the goroutine may resume on another thread
	}
	return s
}

func arg(i int, def int) int {
	if len(os.Args) > i {
		if v, err := strconv.Atoi(os.Args[i]); err == nil {
			return v
		}
	}
	return def
}

func main() {
	if runtime.GOMAXPROCS(0) < 4 {
		runtime.GOMAXPROCS(4)
	}
	goroutines, each, locked := arg(1, 8), arg(2, 2500), arg(3, 0) == 1
	var wg sync.WaitGroup
	var sum atomic.Int64
	for g := 0; g < goroutines; g++ {
		wg.Add(1)
		go func(g int) {
			defer wg.Done()
			if locked {
				runtime.LockOSThread()
			}
			s := 0
			for i := 0; i < each; i++ {
				s += work(g*each + i)
			}
			sum.Add(int64(s))
		}(g)
	}
	wg.Wait()
	fmt.Printf("calls=%d sum=%d\n", calls.Load(), sum.Load())
}
