//! The planner's searches over every function's sweep (rewriter/sweep_search.py).
//!
//! `Windows.inner_window` tries windows starting at a site, then one instruction
//! earlier each time, and skips those that a branch of a nearby function or a C++
//! landing pad lands inside; `Windows.window` takes the instructions at an entry;
//! `ReturnExits.exit_points` looks for the rows that may leave a function (the Python
//! code is the reference). On a big file these walks are seconds of Python, and
//! they need nothing but arrays: the sweeps (as `sweep_functions` made them, read in
//! place), every function's range, its jump tables' cases and the landing pads. This
//! is those walks, on those arrays. They answer only where they are sure to find what
//! the Python code finds; anything else (no window, a function whose targets are not
//! all here) is left to it, which also gives the reasons. Nothing here knows an
//! instruction set.

use pyo3::prelude::*;
use pyo3::types::PyBytes;

use crate::{int64s, view};

/// The rows the planner reads around a window (SweepSearch::rows_read).
type Rows = (i64, Vec<i64>, Vec<i64>, Vec<(i64, i64)>);

/// int64 values as a bytes object.
fn packed(py: Python<'_>, values: &[i64]) -> Py<PyBytes> {
    let raw: Vec<u8> = values.iter().flat_map(|v| v.to_ne_bytes()).collect();
    PyBytes::new(py, &raw).unbind()
}

#[pyclass(module = "urewrite.arch.x86_64.native_sweep")]
pub struct SweepSearch {
    // the sweeps of every function, one after another (sweep_functions' arrays)
    edges: Py<PyBytes>,
    rows: Py<PyBytes>,
    kinds: Py<PyBytes>,
    targets: Py<PyBytes>,
    marked: Py<PyBytes>,
    exit_kinds: (u8, u8, u8, u8), // the Sweep kinds jump, branch, return, other
    // per function, in address order: where its edges, rows and marked start in those
    // arrays, and how many (edges -1: not among them, so not searched here)
    spans: Vec<[i64; 6]>,
    starts: Vec<i64>,
    ends: Vec<i64>,
    ends_so_far: Vec<i64>, // the greatest end of any function up to each one
    own_targets: Vec<bool>, // whether its near targets are all here (not a .cold part's)
    // each function's jump table cases: cases[case_starts[k]..case_starts[k + 1]]
    cases: Vec<i64>,
    case_starts: Vec<i64>,
    pads: Vec<i64>,             // landing pads, sorted
    unreadable: Vec<(i64, i64)>, // ranges whose landing pads are unknown
    reach: i64,                 // how far a short branch reaches, with its own size
    look_back: i64,             // how far before the site a window may start
    near: (usize, Option<Vec<i64>>), // the last function asked: its near targets, sorted
}

impl SweepSearch {
    /// The branch targets of the functions within a short branch of function k
    /// (BranchSafety.near_targets), sorted; None if one of them is not here.
    fn near_targets(&self, py: Python<'_>, k: usize) -> PyResult<Option<Vec<i64>>> {
        let targets_all = view(self.targets.bind(py).as_bytes())?;
        let (low, high) = (self.starts[k] - self.reach, self.ends[k] + self.reach);
        let mut found = Vec::new();
        let mut j = self.ends_so_far.partition_point(|&e| e < low);
        while j < self.starts.len() && self.starts[j] <= high {
            if self.ends[j] + self.reach >= self.starts[k] {
                let [_, edges, row, rows, _, _] = self.spans[j];
                if edges < 0 {
                    return Ok(None);
                }
                found.extend(targets_all[row as usize..(row + rows) as usize].iter().filter(|&&t| t >= 0));
                found.extend_from_slice(&self.cases[self.case_starts[j] as usize..self.case_starts[j + 1] as usize]);
            }
            j += 1;
        }
        found.sort_unstable();
        found.dedup();
        Ok(Some(found))
    }

    /// What BinaryModel.insns needs to make the instructions the planner reads around a
    /// window: of the rows read, [read_from, read_end), those of the window alone,
    /// [first, last], when no other row read is marked (the others then need no
    /// closer look), else all of them: (their first row, the edges of those rows, the
    /// marked ones among them and the direct targets of those that branch, (row,
    /// target) each, rows counted from their first).
    #[allow(clippy::too_many_arguments)]
    fn rows_read(&self, py: Python<'_>, k: usize, edges: &[i64], read_from: usize, read_end: usize,
                 first: usize, last: usize) -> PyResult<Rows> {
        let [_, _, row, rows, mark, marks] = self.spans[k];
        let marked = &view(self.marked.bind(py).as_bytes())?[mark as usize..(mark + marks) as usize];
        let inside = |lo: usize, hi: usize| {
            let j = marked.partition_point(|&m| m < lo as i64);
            j < marked.len() && marked[j] < hi as i64
        };
        let clean = !inside(read_from, first) && !inside(last + 1, read_end);
        let (lo, hi) = if clean { (first, last + 1) } else { (read_from, read_end) };
        // (where the values of a sorted slice in [lo, hi) start and end)
        let within = |values: &[i64]| {
            (values.partition_point(|&v| v < lo as i64), values.partition_point(|&v| v < hi as i64))
        };
        let (a, b) = within(marked);
        let rows_all = &view(self.rows.bind(py).as_bytes())?[row as usize..(row + rows) as usize];
        let targets_all = &view(self.targets.bind(py).as_bytes())?[row as usize..(row + rows) as usize];
        let (c, d) = within(rows_all);
        let direct = (c..d).filter(|&j| targets_all[j] >= 0)
            .map(|j| (rows_all[j] - lo as i64, targets_all[j])).collect();
        Ok((lo as i64, edges[lo..hi + 1].to_vec(), marked[a..b].iter().map(|&m| m - lo as i64).collect(), direct))
    }

    /// inner()'s search: (first, last, end, read_from, end_row): the window's first and
    /// last rows and its end, and the rows the Python search reads, [read_from, end_row).
    #[allow(clippy::too_many_arguments, clippy::type_complexity)]
    fn find_inner(&mut self, py: Python<'_>, site: i64, k: usize, size: i64, borrow: &Bound<'_, PyAny>,
                  below: i64) -> PyResult<Option<(usize, usize, i64, usize, usize)>> {
        if k >= self.spans.len() || !self.own_targets[k] {
            return Ok(None);
        }
        let [edge, edges_n, ..] = self.spans[k];
        if edges_n < 1 {
            return Ok(None);
        }
        let edges_all = self.edges.bind(py).as_bytes();
        let edges = &view(edges_all)?[edge as usize..(edge + edges_n) as usize];
        let n = (edges_n - 1) as usize; // instructions
        let at = edges.partition_point(|&e| e < site);
        if at >= n || edges[at] != site {
            return Ok(None);
        }
        let first_row = edges.partition_point(|&e| e < site - self.look_back);
        let end_row = (edges.partition_point(|&e| e < site + size) + 1).min(n);
        let top = if below <= at as i64 { below - 1 } else { at as i64 };
        if top < first_row as i64 {
            return Ok(None);
        }
        for first in (first_row..=top as usize).rev() {
            let start = edges[first];
            if site - start > self.look_back {
                break;
            }
            let mut last = at; // the window always holds the site's own instruction
            while last < end_row && edges[last + 1] - start < size {
                last += 1;
            }
            let end = if last < end_row {
                edges[last + 1]
            } else {
                // the function ends first: the padding after it, if any
                last = end_row - 1;
                let end: i64 = borrow.call1((k, start, edges[end_row], size))?.extract()?;
                if end < 0 {
                    continue;
                }
                end
            };
            if self.near.0 != k {
                self.near = (k, self.near_targets(py, k)?);
            }
            let Some(near) = &self.near.1 else { return Ok(None) };
            let j = near.partition_point(|&t| t <= start);
            if j < near.len() && near[j] < end {
                continue; // a branch lands inside
            }
            if first < last && self.pad_inside(start, end) {
                continue;
            }
            let read_from = if first < at { first_row } else { at };
            return Ok(Some((first, last, end, read_from, end_row)));
        }
        Ok(None)
    }

    /// entry()'s search: (first, last, end, read_from, head): the window's first and
    /// last rows and its end, and the rows Planner.head reads, [read_from, head).
    #[allow(clippy::type_complexity)]
    fn find_entry(&self, py: Python<'_>, site: i64, k: usize, size: i64, borrow: &Bound<'_, PyAny>,
                  pad: i64) -> PyResult<Option<(usize, usize, i64, usize, usize)>> {
        if k >= self.spans.len() {
            return Ok(None);
        }
        let [edge, edges_n, ..] = self.spans[k];
        if edges_n < 2 {
            return Ok(None);
        }
        let edges = &view(self.edges.bind(py).as_bytes())?[edge as usize..(edge + edges_n) as usize];
        let n = (edges_n - 1) as usize;
        let head = (edges.partition_point(|&e| e < self.starts[k] + 4 + size) + 1).min(n);
        let start = site + pad;
        let first = edges.partition_point(|&e| e < start);
        if first >= head || edges[first] != start {
            return Ok(None);
        }
        let mut last = first;
        while last < head && edges[last + 1] - start < size {
            last += 1;
        }
        let end = if last < head {
            edges[last + 1]
        } else {
            last = head - 1;
            if edges[head] < self.ends[k] {
                return Ok(None); // (its code does not decode that far)
            }
            let end: i64 = borrow.call1((k, start, edges[head], size))?.extract()?;
            if end < 0 {
                return Ok(None);
            }
            end
        };
        let read_from = if pad > 0 { 1 } else { 0 };
        Ok(Some((first, last, end, read_from.min(first), head)))
    }

    /// A batch's answers (inner_batch()): find(self, j, k) for the j-th of `count` sites,
    /// in function k (`ks`), each with what batch_rows() writes of it.
    #[allow(clippy::type_complexity)]
    fn batch<F>(&mut self, py: Python<'_>, ks: &[u8], count: usize, mut find: F)
                -> PyResult<(Py<PyBytes>, Py<PyBytes>)>
    where F: FnMut(&mut Self, usize, usize) -> PyResult<Option<(usize, usize, i64, usize, usize)>> {
        let ks = int64s(ks);
        if ks.len() != count {
            return Err(pyo3::exceptions::PyValueError::new_err("sites and ks differ in length"));
        }
        let (mut found, mut made) = (Vec::with_capacity(4 * count), Vec::new());
        for (j, &k) in ks.iter().enumerate() {
            match find(self, j, k as usize)? {
                Some((first, last, end, read_from, read_end)) => self.batch_rows(
                    py, k as usize, first, last, end, read_from, read_end, &mut found, &mut made)?,
                None => found.extend_from_slice(&[-1, -1, -1, -1]),
            }
        }
        Ok((packed(py, &found), packed(py, &made)))
    }

    /// For a window of function k found by a batch: its four values in `found` (see
    /// inner_batch()), and in `made`, what the planner needs to make the marked rows
    /// of those read, [read_from, read_end): how many rows the window has (n) and how
    /// many other marked rows are read (m); three values for each row of the window,
    /// its first byte, what it is (0 unmarked, 1 a return, 2 a direct target, 3 marked
    /// and of no kind, as landing pads and indirect calls are, 4 of another kind with
    /// no direct target, as indirect jumps are) and its target (or -1), then the end
    /// of its last row; four for each of the others, the same and its end.
    #[allow(clippy::too_many_arguments)]
    fn batch_rows(&self, py: Python<'_>, k: usize, first: usize, last: usize, end: i64, read_from: usize,
                  read_end: usize, found: &mut Vec<i64>, made: &mut Vec<i64>) -> PyResult<()> {
        let [edge, edges_n, row, rows, mark, marks] = self.spans[k];
        let edges = &view(self.edges.bind(py).as_bytes())?[edge as usize..(edge + edges_n) as usize];
        let marked = &view(self.marked.bind(py).as_bytes())?[mark as usize..(mark + marks) as usize];
        let rows_all = &view(self.rows.bind(py).as_bytes())?[row as usize..(row + rows) as usize];
        let targets_all = &view(self.targets.bind(py).as_bytes())?[row as usize..(row + rows) as usize];
        let kinds_all = &self.kinds.bind(py).as_bytes()[row as usize..(row + rows) as usize];
        let read_end = read_end.max(last + 1);
        let (a, b) = (marked.partition_point(|&m| m < read_from as i64),
                      marked.partition_point(|&m| m < read_end as i64));
        let mut codes = vec![(0i64, -1i64); last + 1 - first];
        let mut others: Vec<[i64; 4]> = Vec::new();
        for &m in &marked[a..b] {
            // (as BinaryModel.insns makes them: a direct target's from it, others decoded)
            let j = rows_all.partition_point(|&r| r < m);
            let (code, target) = if j == rows_all.len() || rows_all[j] != m {
                (3, -1)
            } else if targets_all[j] >= 0 {
                (2, targets_all[j])
            } else if kinds_all[j] == self.exit_kinds.2 {
                (1, -1)
            } else {
                (4, -1)
            };
            let m = m as usize;
            if first <= m && m <= last {
                codes[m - first] = (code, target);
            } else {
                others.push([edges[m], code, target, edges[m + 1]]);
            }
        }
        found.extend_from_slice(&[first as i64, last as i64, end, 1]);
        made.extend_from_slice(&[codes.len() as i64, others.len() as i64]);
        for (j, &(code, target)) in codes.iter().enumerate() {
            made.extend_from_slice(&[edges[first + j], code, target]);
        }
        made.push(edges[last + 1]);
        for other in &others {
            made.extend_from_slice(other);
        }
        Ok(())
    }

    /// Whether a landing pad lies in (start, end), or may (LandingPads.first_inside,
    /// unknown_inside).
    fn pad_inside(&self, start: i64, end: i64) -> bool {
        let k = self.pads.partition_point(|&p| p <= start);
        (k < self.pads.len() && self.pads[k] < end)
            || self.unreadable.iter().any(|&(a, b)| a < end && start + 1 < b)
    }
}

#[pymethods]
impl SweepSearch {
    #[new]
    #[allow(clippy::too_many_arguments)]
    fn new(
        edges: Py<PyBytes>,
        rows: Py<PyBytes>,
        kinds: Py<PyBytes>,
        targets: Py<PyBytes>,
        marked: Py<PyBytes>,
        spans: &[u8],
        starts: &[u8],
        ends: &[u8],
        own_targets: &[u8],
        cases: &[u8],
        case_starts: &[u8],
        pads: &[u8],
        unreadable: &[u8],
        reach: i64,
        look_back: i64,
        exit_kinds: (u8, u8, u8, u8),
    ) -> PyResult<Self> {
        let (starts, ends) = (int64s(starts), int64s(ends));
        let spans: Vec<[i64; 6]> =
            int64s(spans).chunks_exact(6).map(|c| [c[0], c[1], c[2], c[3], c[4], c[5]]).collect();
        let case_starts = int64s(case_starts);
        let n = starts.len();
        if ends.len() != n || spans.len() != n || own_targets.len() != n || case_starts.len() != n + 1 {
            return Err(pyo3::exceptions::PyValueError::new_err("per-function arrays differ in length"));
        }
        let mut ends_so_far = Vec::with_capacity(n);
        for &e in &ends {
            ends_so_far.push(ends_so_far.last().map_or(e, |&m: &i64| m.max(e)));
        }
        let unreadable = int64s(unreadable).chunks_exact(2).map(|c| (c[0], c[1])).collect();
        Ok(SweepSearch {
            edges,
            rows,
            kinds,
            targets,
            marked,
            exit_kinds,
            spans,
            starts,
            ends,
            ends_so_far,
            own_targets: own_targets.iter().map(|&b| b != 0).collect(),
            cases: int64s(cases),
            case_starts,
            pads: int64s(pads),
            unreadable,
            reach,
            look_back,
            near: (usize::MAX, None),
        })
    }

    /// The window for a site at `site` in function `k` that a jump of `size` bytes
    /// needs, as Windows.inner_window finds it: (first, last, end, rows): the
    /// window's first and last rows, its end, and the rows read (rows_read()) of those
    /// the Python search reads (from 24 bytes before the site, or from the site when
    /// the first window is the one, to the first row a jump's size after the site).
    /// None where the Python search must decide.
    /// `borrow(k, start, end, size)`: where a window from `start` ends when it takes
    /// the padding after function k's code (which ends at `end`), or -1 if it cannot
    /// (Windows.borrow_padding). `below`: only windows whose first row is below it
    /// (the search goes on past a window whose instructions cannot move).
    #[pyo3(signature = (site, k, size, borrow, below = i64::MAX))]
    #[allow(clippy::too_many_arguments)]
    fn inner(&mut self, py: Python<'_>, site: i64, k: usize, size: i64, borrow: &Bound<'_, PyAny>,
             below: i64) -> PyResult<Option<(i64, i64, i64, Rows)>> {
        let Some((first, last, end, read_from, end_row)) = self.find_inner(py, site, k, size, borrow, below)? else {
            return Ok(None);
        };
        let [edge, edges_n, ..] = self.spans[k];
        let edges = &view(self.edges.bind(py).as_bytes())?[edge as usize..(edge + edges_n) as usize];
        let rows = self.rows_read(py, k, edges, read_from, end_row, first, last)?;
        Ok(Some((first as i64, last as i64, end, rows)))
    }

    /// inner() for many sites at once (`sites`, `ks`: int64 each), with what the
    /// planner needs to make the marked rows the Python search reads (batch_rows()).
    /// (found, rows), int64 each. `found` holds four values per site: the window's
    /// first and last rows, its end, and 1 where its rows follow in `rows`, -1 where
    /// there is no window to give (ask inner(): None). `rows`: what batch_rows()
    /// writes for each window marked 1.
    fn inner_batch(&mut self, py: Python<'_>, sites: &[u8], ks: &[u8], size: i64,
                   borrow: &Bound<'_, PyAny>) -> PyResult<(Py<PyBytes>, Py<PyBytes>)> {
        let sites = int64s(sites);
        self.batch(py, ks, sites.len(), |search, j, k| search.find_inner(py, sites[j], k, size, borrow, i64::MAX))
    }

    /// entry() for many function entries at once (`sites`, `ks`, `pads`: int64 each),
    /// as inner_batch() gives them.
    fn entry_batch(&mut self, py: Python<'_>, sites: &[u8], ks: &[u8], pads: &[u8], size: i64,
                   borrow: &Bound<'_, PyAny>) -> PyResult<(Py<PyBytes>, Py<PyBytes>)> {
        let (sites, pads) = (int64s(sites), int64s(pads));
        if sites.len() != pads.len() {
            return Err(pyo3::exceptions::PyValueError::new_err("sites and pads differ in length"));
        }
        self.batch(py, ks, sites.len(), |search, j, k| search.find_entry(py, sites[j], k, size, borrow, pads[j]))
    }

    /// The window at the entry of function k (at `site`, its first byte) that a jump
    /// of `size` bytes needs, as Windows.window takes it: the instructions from the
    /// entry on, past a landing pad of `pad` bytes, until they cover the jump, and the
    /// padding after the function if they do not (`borrow`, as for inner()): (first,
    /// last, end, rows): the window's first and last rows, its end, and the rows read
    /// (rows_read()) of those Planner.head reads (the landing pad aside: the caller
    /// read it). None where the Python planner must decide.
    #[pyo3(signature = (site, k, size, borrow, pad = 0))]
    fn entry(&self, py: Python<'_>, site: i64, k: usize, size: i64, borrow: &Bound<'_, PyAny>, pad: i64)
             -> PyResult<Option<(i64, i64, i64, Rows)>> {
        let Some((first, last, end, read_from, head)) = self.find_entry(py, site, k, size, borrow, pad)? else {
            return Ok(None);
        };
        let [edge, edges_n, ..] = self.spans[k];
        let edges = &view(self.edges.bind(py).as_bytes())?[edge as usize..(edge + edges_n) as usize];
        let rows = self.rows_read(py, k, edges, read_from, head, first, last)?;
        Ok(Some((first as i64, last as i64, end, rows)))
    }

    /// The rows of function k that may leave it, as ReturnExits.exit_points goes over
    /// them: returns, other branches (indirect ones), and direct jumps and branches
    /// to a target outside the function: (row, kind, target, address) each, in order.
    /// None where the function is not here.
    fn exits(&self, py: Python<'_>, k: usize) -> PyResult<Option<Vec<(i64, u8, i64, i64)>>> {
        if k >= self.spans.len() || self.spans[k][1] < 0 {
            return Ok(None);
        }
        let [edge, _, row, rows, _, _] = self.spans[k];
        let (jump, branch, ret, other) = self.exit_kinds;
        let edges = &view(self.edges.bind(py).as_bytes())?[edge as usize..];
        let span = row as usize..(row + rows) as usize;
        let rows_all = &view(self.rows.bind(py).as_bytes())?[span.clone()];
        let targets_all = &view(self.targets.bind(py).as_bytes())?[span.clone()];
        let kinds_all = &self.kinds.bind(py).as_bytes()[span];
        let (start, end) = (self.starts[k], self.ends[k]);
        Ok(Some((0..rows_all.len())
            .filter(|&j| {
                let kind = kinds_all[j];
                if kind == jump || kind == branch {
                    !(start <= targets_all[j] && targets_all[j] < end)
                } else {
                    kind == ret || kind == other
                }
            })
            .map(|j| (rows_all[j], kinds_all[j], targets_all[j], edges[rows_all[j] as usize]))
            .collect()))
    }
}
