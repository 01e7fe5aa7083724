// A Go program that exercises what the runtime does behind a program's back:
// goroutines over channels, a recursion that grows the stack, panic/recover,
// defer, closures, interface methods, generics, runtime.GC(), and a busy
// goroutine that only asynchronous preemption can stop. Its output is the same
// on every run; `calls` prints how often main.work ran, for return counts.
package main

import (
	"errors"
	"fmt"
	"os"
	"runtime"
	"runtime/debug"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"features/asm"
)

type Shape interface {
	Area() float64
	Name() string
}

type Rect struct{ W, H float64 }
type Circle struct{ R float64 }

func (r Rect) Area() float64   { return r.W * r.H }
func (r Rect) Name() string    { return "rect" }
func (c Circle) Area() float64 { return 3 * c.R * c.R }
func (c Circle) Name() string  { return "circle" }

type Counter struct{ n int64 }

// Scale's first instructions touch no memory (a load would be Go's nil check, which
// may fault: no window moves it), so its entry can be probed.
//
//go:noinline
func (c *Counter) Scale(k int64) int64 {
	if k == 0 {
		return 0
	}
	c.n *= k
	return c.n
}

//go:noinline
func (c *Counter) Add(k int64) { c.n += k }

type Number interface{ ~int | ~int64 | ~float64 }

//go:noinline
func Map[T, U any](xs []T, f func(T) U) []U {
	out := make([]U, 0, len(xs))
	for _, x := range xs {
		out = append(out, f(x))
	}
	return out
}

//go:noinline
func Sum[T Number](xs []T) T {
	var s T
	for _, x := range xs {
		s += x
	}
	return s
}

var workCalls atomic.Int64

// set by cgo.go where cgo is on: the program then calls into C too
var cgoTwice = func(x int) int { return 2 * x }

//go:noinline
func work(x int) int {
	workCalls.Add(1)
	return x*x%97 + 1
}

// deep recurses with a large frame, so the goroutine's stack is copied as it grows.
//
//go:noinline
func deep(n int) int {
	var pad [64]int64
	pad[n%64] = int64(n)
	if n == 0 {
		return int(pad[0])
	}
	return deep(n-1) + int(pad[n%64]%3)
}

type Box struct{ pad, n int64 }

// Get's first instruction is its load, which is also Go's nil check: a nil Box
// faults there, where the traceback must find it.
//
//go:noinline
func (b *Box) Get() int64 { return b.n }

// nilFault recovers from a fault in Get and prints the frames of main the stack
// shows, with the lines they are at.
func nilFault(b *Box) (v int64) {
	defer func() {
		if r := recover(); r != nil {
			fmt.Println("recovered:", r)
			lines := strings.Split(string(debug.Stack()), "\n")
			for i, l := range lines {
				if strings.HasPrefix(l, "main.") && i+1 < len(lines) {
					at := strings.Fields(lines[i+1])[0]
					fmt.Println("frame:", l[:strings.LastIndex(l, "(")], at[strings.LastIndex(at, "/")+1:])
				}
			}
		}
	}()
	return b.Get()
}

//go:noinline
func mayPanic(i int) (result string, err error) {
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("recovered: %v", r)
		}
	}()
	if i%3 == 0 {
		panic("multiple of three: " + strconv.Itoa(i))
	}
	if i%5 == 0 {
		var m map[string]int
		m["x"] = i // a runtime error: assignment to a nil map
	}
	return "fine " + strconv.Itoa(i), nil
}

//go:noinline
func worker(id int, jobs <-chan int, results chan<- [2]int, wg *sync.WaitGroup) {
	defer wg.Done()
	for j := range jobs {
		results <- [2]int{j, work(j) + id*0}
	}
}

// spin never calls a function: only an asynchronous preemption stops it for GC.
//
//go:noinline
func spin(stop *atomic.Bool) uint64 {
	var x uint64 = 1
	for !stop.Load() {
		x = x*6364136223846793005 + 1442695040888963407
	}
	return x
}

// args3, describe and asm.Sub are traced with --args: main prints the arguments it
// passes and what they return, for a test to compare with the trace.
//
//go:noinline
func args3(a, b, c int) int { return a*100 + b*10 + c }

// describe takes a string: two words (pointer, length), then n.
//
//go:noinline
func describe(s string, n int) int { return len(s) * n }

func main() {
	rounds := 200
	if len(os.Args) > 1 {
		rounds, _ = strconv.Atoi(os.Args[1])
	}
	if len(os.Args) > 1 && os.Args[1] == "nil" { // a fault nothing recovers from
		var b *Box
		fmt.Println(b.Get())
	}

	// goroutines over channels
	jobs, results := make(chan int), make(chan [2]int, 16)
	var wg sync.WaitGroup
	for i := 0; i < 4; i++ {
		wg.Add(1)
		go worker(i, jobs, results, &wg)
	}
	go func() {
		for j := 0; j < rounds; j++ {
			jobs <- j
		}
		close(jobs)
	}()
	go func() { wg.Wait(); close(results) }()
	total := 0
	for r := range results {
		total += r[0] * r[1]
	}
	fmt.Println("workers:", total)

	// a busy goroutine, and GCs that must preempt it
	var stop atomic.Bool
	spun := make(chan uint64)
	go func() { spun <- spin(&stop) }()
	for i := 0; i < 3; i++ {
		runtime.GC()
		time.Sleep(time.Millisecond)
	}
	stop.Store(true)
	<-spun
	fmt.Println("preempted: ok")

	// stack growth
	fmt.Println("deep:", deep(20000))

	// panic/recover and defer
	var msgs []string
	for i := 1; i <= 10; i++ {
		res, err := mayPanic(i)
		if err != nil {
			msgs = append(msgs, err.Error())
		} else {
			msgs = append(msgs, res)
		}
	}
	fmt.Println(strings.Join(msgs, "; "))

	// closures, interfaces, methods, generics
	base := 10
	add := func(x int) int { base++; return x + base }
	fmt.Println("closure:", Map([]int{1, 2, 3}, add), base)
	shapes := []Shape{Rect{2, 3}, Circle{2}, Rect{1, 1}}
	sort.Slice(shapes, func(i, j int) bool { return shapes[i].Area() < shapes[j].Area() })
	names := Map(shapes, func(s Shape) string { return fmt.Sprintf("%s=%.1f", s.Name(), s.Area()) })
	fmt.Println("shapes:", names)
	fmt.Println("sums:", Sum([]int{1, 2, 3}), Sum([]float64{0.5, 0.25}))
	c := &Counter{n: 1}
	for i := 0; i < 5; i++ {
		c.Add(2)
		c.Scale(3)
	}
	fmt.Println("counter:", c.n)
	fmt.Println("box:", nilFault(&Box{n: 4}))
	fmt.Println("box:", nilFault(nil))
	var err error = errors.New("plain")
	fmt.Println("twice:", cgoTwice(21))
	fmt.Println("error:", errors.Unwrap(fmt.Errorf("wrapped: %w", err)) == err)
	runtime.GC()
	a, b, k := 7, -3, 1<<40
	fmt.Println("args3:", a, b, k, args3(a, b, k))
	word := "features"
	fmt.Println("describe:", len(word), 3, describe(word, 3))
	fmt.Println("asm.Sub:", 50, 8, asm.Sub(50, 8))
	fmt.Println("calls:", workCalls.Load())
}
