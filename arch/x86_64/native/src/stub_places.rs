//! Where punned jumps' stubs may go: the first candidates that fit, in order
//! (rewriter/stub_space.py, `StubSpace.first` and `first_in_rows`).
//!
//! The Python code (the reference) answers for a whole array of candidates with numpy,
//! then takes the first that fit: a successor's punned jump asks tens of thousands of
//! candidates, and a big file's return probes thousands of such searches. Here a search stops at
//! the first that fit, and once the stubs use every page the cap allows, looks only at
//! candidates on those pages. The rules are stub_space.py's, one candidate at a time;
//! tests/test_stub_space.py holds the two to the same answers. Nothing here knows an
//! instruction set.

use pyo3::prelude::*;

use crate::view;

#[pyclass(module = "urewrite.arch.x86_64.native_sweep")]
pub struct StubPlaces {
    floor: i64,
    size: i64,  // bytes of one stub
    reach: i64, // how far above its source a stub may be
    page: i64,
    cap: i64,         // pages the stubs may use
    starts: Vec<i64>, // the stubs taken, sorted
    pages: Vec<i64>,  // the pages they are on, sorted
}

/// One search's view of the pages: those in use, with a taken stub's that are not yet.
struct Pages<'a> {
    used: &'a [i64],
    extra: Vec<i64>,
}

impl Pages<'_> {
    fn known(&self, page: i64) -> bool {
        self.used.binary_search(&page).is_ok() || self.extra.contains(&page)
    }

    fn count(&self) -> i64 {
        (self.used.len() + self.extra.len()) as i64
    }
}

impl StubPlaces {
    fn page_of(&self, address: i64) -> i64 {
        address & -self.page
    }

    fn pages_with(&self, taken: &[i64]) -> Pages<'_> {
        let mut extra = Vec::new();
        for &stub in taken {
            for page in [self.page_of(stub), self.page_of(stub + self.size - 1)] {
                if self.pages.binary_search(&page).is_err() && !extra.contains(&page) {
                    extra.push(page);
                }
            }
        }
        Pages { used: &self.pages, extra }
    }

    /// stub_space.py's rules for one candidate, with the stubs `taken` taken too.
    fn fits(&self, stub: i64, source: i64, taken: &[i64], pages: &Pages) -> bool {
        if stub < self.floor || stub > source + self.reach {
            return false;
        }
        if taken.iter().any(|&t| (stub - t).abs() < self.size) {
            return false;
        }
        let (first, last) = (self.page_of(stub), self.page_of(stub + self.size - 1));
        let new = !pages.known(first) as i64 + (last != first && !pages.known(last)) as i64;
        pages.count() + new <= self.cap && self.clear(stub)
    }

    /// Whether a stub at `stub` overlaps none taken.
    fn clear(&self, stub: i64) -> bool {
        let k = self.starts.partition_point(|&s| s < stub);
        (k == self.starts.len() || self.starts[k] - stub >= self.size)
            && (k == 0 || stub - self.starts[k - 1] >= self.size)
    }

    /// The indices of the first `limit` of `stubs` that fit, in order.
    fn first_of(&self, stubs: &[i64], source: i64, taken: &[i64], limit: usize) -> Vec<usize> {
        let pages = self.pages_with(taken);
        // the runs of candidates to look at, in order: all of them, or where they are
        // sorted (a search's), only those from the floor to the source's reach, and when
        // no page more may be used, only those on a page in use
        let mut runs = vec![(0, stubs.len())];
        if stubs.windows(2).all(|w| w[0] <= w[1]) {
            let lo = stubs.partition_point(|&s| s < self.floor);
            let hi = stubs.partition_point(|&s| s <= source + self.reach).max(lo);
            runs = vec![(lo, hi)];
            if pages.count() >= self.cap && hi - lo > 2 * pages.count() as usize {
                // (a run per page in use: pages in use are sorted, a taken stub's few
                // others merged in)
                let within = &stubs[lo..hi];
                let run = |page: i64| (lo + within.partition_point(|&s| s < page),
                                       lo + within.partition_point(|&s| s < page + self.page));
                runs = pages.used.iter().map(|&p| run(p)).collect();
                for &page in &pages.extra {
                    let added = run(page);
                    runs.insert(runs.partition_point(|r| r.0 < added.0), added);
                }
            }
        }
        let mut found = Vec::new();
        for (start, end) in runs {
            for k in start..end {
                if self.fits(stubs[k], source, taken, &pages) {
                    found.push(k);
                    if found.len() == limit {
                        return found;
                    }
                }
            }
        }
        found
    }
}

#[pymethods]
impl StubPlaces {
    #[new]
    fn new(floor: i64, size: i64, reach: i64, page: i64, cap: i64) -> Self {
        StubPlaces { floor, size, reach, page, cap, starts: Vec::new(), pages: Vec::new() }
    }

    /// Take a stub (the caller has found that it fits): an error if it overlaps one.
    fn take(&mut self, stub: i64) -> PyResult<()> {
        if !self.clear(stub) {
            return Err(pyo3::exceptions::PyValueError::new_err(format!(
                "a stub at {stub:#x} overlaps one taken")));
        }
        self.starts.insert(self.starts.partition_point(|&s| s < stub), stub);
        for page in [self.page_of(stub), self.page_of(stub + self.size - 1)] {
            if let Err(k) = self.pages.binary_search(&page) {
                self.pages.insert(k, page);
            }
        }
        Ok(())
    }

    /// The indices of the first `limit` stubs (int64 values, packed) that fit for the
    /// jump at `source`, with the stubs `taken` taken too, in order.
    fn first(&self, py: Python<'_>, stubs: &[u8], source: i64, taken: Vec<i64>, limit: usize)
             -> PyResult<Vec<usize>> {
        let stubs = view(stubs)?;
        Ok(py.detach(|| self.first_of(stubs, source, &taken, limit)))
    }

    /// (row, column) of the first stub that fits in the first row that has one, of rows
    /// of `columns` stubs each (packed), each row's with its stub of `taken` taken too.
    fn first_in_rows(&self, py: Python<'_>, stubs: &[u8], columns: usize, source: i64,
                     taken: Vec<i64>) -> PyResult<Option<(usize, usize)>> {
        let stubs = view(stubs)?;
        Ok(py.detach(|| {
            stubs.chunks(columns.max(1)).zip(&taken).enumerate().find_map(|(row, (stubs, &t))| {
                self.first_of(stubs, source, &[t], 1).first().map(|&column| (row, column))
            })
        }))
    }
}
