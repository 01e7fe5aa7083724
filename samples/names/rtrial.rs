// Names as people type them (tests/test_demangled_names.py), in Rust: modules, a
// trait and its impls, generics, closures, a panic caught, threads. main prints the
// calls it made, so that a probe's hits can be checked against them.
use std::hint::black_box;
use std::panic;
use std::thread;

pub mod shapes {
    pub trait Shape {
        fn area(&self) -> f64;
    }

    pub struct Rect {
        pub w: f64,
        pub h: f64,
    }

    pub struct Circle {
        pub r: f64,
    }

    impl Shape for Rect {
        #[inline(never)]
        fn area(&self) -> f64 {
            self.w * self.h
        }
    }

    impl Shape for Circle {
        #[inline(never)]
        fn area(&self) -> f64 {
            3.0 * self.r * self.r
        }
    }
}

pub mod compute {
    #[inline(never)]
    pub fn work(x: u64) -> u64 {
        std::hint::black_box(x).wrapping_mul(2654435761) % 1000
    }

    #[inline(never)]
    pub fn largest<T: PartialOrd + Copy>(items: &[T]) -> T {
        let mut best = items[0];
        for &item in items {
            if item > best {
                best = item;
            }
        }
        best
    }

    #[inline(never)]
    pub fn checked(x: u64) -> u64 {
        if std::hint::black_box(x) % 7 == 3 {
            panic!("refused {x}");
        }
        x + 1
    }

    #[inline(never)]
    pub fn apply<F: Fn(u64) -> u64>(f: F, x: u64) -> u64 {
        f(x)
    }
}

use shapes::Shape;

fn main() {
    let rounds: u64 = std::env::args().nth(1).and_then(|a| a.parse().ok()).unwrap_or(20);
    panic::set_hook(Box::new(|_| {})); // the caught panics print nothing
    let shapes: Vec<Box<dyn Shape>> = vec![
        Box::new(shapes::Rect { w: 2.0, h: 3.0 }),
        Box::new(shapes::Circle { r: 1.0 }),
    ];
    let mut total = 0u64;
    let mut area = 0.0;
    let mut caught = 0;
    for i in 0..rounds {
        total += compute::work(i);
        for s in black_box(&shapes) {
            area += s.area();
        }
        total += compute::largest(black_box(&[i, 3, 9][..]));
        total += compute::largest(black_box(&[i as u32, 5][..])) as u64;
        let k = black_box(i);
        total += compute::apply(move |x| x + k, 1);
        match panic::catch_unwind(|| compute::checked(i)) {
            Ok(v) => total += v,
            Err(_) => caught += 1,
        }
    }
    let workers: Vec<_> = (0..4u64)
        .map(|t| thread::spawn(move || (0..rounds).map(|i| compute::work(i + t)).sum::<u64>()))
        .collect();
    for w in workers {
        total += w.join().unwrap();
    }
    println!("total {total} area {area} caught {caught} work {}", rounds + 4 * rounds);
}
