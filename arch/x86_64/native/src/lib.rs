//! The x86_64 linear sweep of many functions in one call (arch/x86_64/linear_sweep.py).
//!
//! It makes what `X86_64Backend.sweep` makes in Python, one function at a time, with
//! the same decoder (iced-x86, the version the Python package wraps), without an
//! object per instruction. The reference is that Python loop (`python_sweep`); the
//! rules below mirror it line for line, and tests/test_native_sweep.py holds the two
//! to the same results.

use iced_x86::{Code, Decoder, DecoderOptions, FlowControl, Instruction, Mnemonic, OpKind, Register};
use pyo3::prelude::*;
use pyo3::types::PyBytes;

mod return_address;
mod stub_places;
mod sweep_search;

const ENDBR64: [u8; 4] = [0xf3, 0x0f, 0x1e, 0xfa];

/// Sweep kinds (arch/base.py), given by the caller.
#[derive(Clone, Copy)]
struct Kinds {
    plain: u8,
    call: u8,
    jump: u8,
    branch: u8,
    ret: u8,
    other: u8,
}

/// Every function's arrays, one after another.
#[derive(Default)]
struct Sweeps {
    edges: Vec<i64>,
    rows: Vec<i64>,
    kinds: Vec<u8>,
    targets: Vec<i64>,
    marked: Vec<i64>,
    // per function: edges, rows and marked it holds; -1 edges when the decoder met an
    // instruction it cannot decode (the caller sweeps that function its own way)
    counts: Vec<i64>,
}

impl Sweeps {
    fn sweep(&mut self, code: &[u8], address: u64, k: &Kinds) {
        let (edges0, rows0, marked0) = (self.edges.len(), self.rows.len(), self.marked.len());
        let mut decoder = Decoder::with_ip(64, code, address, DecoderOptions::NONE);
        let mut insn = Instruction::default();
        let mut index: i64 = 0;
        let mut sorted = true; // (marked stays in order unless a landing pad is added)
        while decoder.can_decode() {
            decoder.decode_out(&mut insn);
            self.edges.push(insn.ip() as i64);
            let at = index;
            index += 1;
            let flow = insn.flow_control();
            if flow == FlowControl::Next {
                continue;
            }
            let code_ = insn.code();
            if code_ == Code::INVALID {
                self.edges.truncate(edges0);
                self.rows.truncate(rows0);
                self.kinds.truncate(rows0);
                self.targets.truncate(rows0);
                self.marked.truncate(marked0);
                self.counts.extend_from_slice(&[-1, 0, 0]);
                return;
            }
            if !matches!(flow, FlowControl::Return | FlowControl::Interrupt | FlowControl::Exception) {
                self.marked.push(at); // any branch or call
            }
            let mut kind = match flow {
                FlowControl::Call => k.call,
                FlowControl::UnconditionalBranch => k.jump,
                FlowControl::ConditionalBranch => k.branch,
                FlowControl::Return => k.ret,
                FlowControl::IndirectBranch => k.other,
                _ => k.plain, // indirect call, interrupt, exception, xbegin/xabort/xend
            };
            if (kind == k.call || kind == k.jump || kind == k.branch)
                && !matches!(insn.op0_kind(), OpKind::NearBranch16 | OpKind::NearBranch32 | OpKind::NearBranch64)
            {
                kind = if kind == k.call { k.plain } else { k.other }; // syscall, far forms
            }
            if kind == k.branch
                && matches!(insn.mnemonic(), Mnemonic::Loop | Mnemonic::Loope | Mnemonic::Loopne
                                             | Mnemonic::Jrcxz | Mnemonic::Jecxz | Mnemonic::Jcxz)
            {
                kind = k.other; // exit_kind refuses them as exits
            } else if kind == k.ret && !matches!(code_, Code::Retnq | Code::Retnq_imm16) {
                kind = k.other;
            } else if kind == k.plain {
                if !matches!(code_, Code::Xbegin_rel16 | Code::Xbegin_rel32) {
                    continue;
                }
                kind = k.call; // its abort path goes to its target
            }
            self.rows.push(at);
            self.kinds.push(kind);
            self.targets.push(
                if kind == k.call || kind == k.jump || kind == k.branch || flow == FlowControl::ConditionalBranch {
                    insn.near_branch_target() as i64
                } else {
                    -1
                },
            );
        }
        self.edges.push(address.wrapping_add(decoder.position() as u64) as i64);
        // landing pads, by their bytes: the instruction that holds each
        let starts = &self.edges[edges0..];
        let count = starts.len() - 1;
        let mut from = 0;
        while let Some(found) = find(&code[from..], &ENDBR64) {
            let offset = (from + found) as i64;
            let holder = starts.partition_point(|&s| s <= address as i64 + offset) as i64 - 1;
            if 0 <= holder && (holder as usize) < count {
                self.marked.push(holder);
                sorted = false;
            }
            from += found + 1;
        }
        if !sorted {
            let tail = &mut self.marked[marked0..];
            tail.sort_unstable();
            let mut kept = 0;
            for i in 0..tail.len() {
                if i == 0 || tail[i] != tail[kept - 1] {
                    tail[kept] = tail[i];
                    kept += 1;
                }
            }
            self.marked.truncate(marked0 + kept);
        }
        self.counts.extend_from_slice(&[
            (self.edges.len() - edges0) as i64,
            (self.rows.len() - rows0) as i64,
            (self.marked.len() - marked0) as i64,
        ]);
    }
}

/// A value written in native byte order (the arrays handed to Python).
trait NeBytes: Copy {
    const SIZE: usize;
    fn put(self, out: &mut [u8]);
}

impl NeBytes for i64 {
    const SIZE: usize = 8;
    fn put(self, out: &mut [u8]) {
        out.copy_from_slice(&self.to_ne_bytes());
    }
}

impl NeBytes for u8 {
    const SIZE: usize = 1;
    fn put(self, out: &mut [u8]) {
        out[0] = self;
    }
}

/// The runs' arrays of one field, one after another, as bytes made in place (no joined
/// copy: node's edges are 50 MB).
fn joined<'py, T: NeBytes>(
    py: Python<'py>,
    runs: &[Sweeps],
    field: fn(&Sweeps) -> &Vec<T>,
) -> Bound<'py, PyBytes> {
    let total: usize = runs.iter().map(|r| field(r).len() * T::SIZE).sum();
    PyBytes::new_with(py, total, |out| {
        for (v, place) in runs.iter().flat_map(|r| field(r).iter()).zip(out.chunks_exact_mut(T::SIZE)) {
            v.put(place);
        }
        Ok(())
    })
    .expect("bytes of a known size")
}

/// How many threads to sweep with: the machine's cores (at most 8), one for less
/// than a few megabytes (a thread's start would cost more than it saves).
fn threads_for(sizes: &[i64]) -> usize {
    let total: i64 = sizes.iter().sum();
    if total < 4 << 20 {
        return 1;
    }
    std::thread::available_parallelism().map_or(1, |n| n.get()).clamp(1, 8)
}

/// [first, end) of `n` runs of the functions, each about as many bytes as the others.
fn runs_of(sizes: &[i64], n: usize) -> Vec<(usize, usize)> {
    let total: i64 = sizes.iter().sum();
    let mut runs = Vec::with_capacity(n);
    let (mut first, mut sum) = (0, 0i64);
    for (i, &s) in sizes.iter().enumerate() {
        sum += s;
        if runs.len() + 1 < n && sum * n as i64 >= total * (runs.len() as i64 + 1) {
            runs.push((first, i + 1));
            first = i + 1;
        }
    }
    runs.push((first, sizes.len()));
    runs
}

/// What a panic carried: its message, where it was a string.
fn panic_text(payload: &Box<dyn std::any::Any + Send>) -> String {
    payload
        .downcast_ref::<&str>()
        .map(|s| s.to_string())
        .or_else(|| payload.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "(no message)".to_string())
}

fn find(haystack: &[u8], needle: &[u8]) -> Option<usize> {
    haystack.windows(needle.len()).position(|w| w == needle)
}

/// int64 values packed in bytes (native order), copied.
pub(crate) fn int64s(raw: &[u8]) -> Vec<i64> {
    raw.chunks_exact(8).map(|c| i64::from_ne_bytes(c.try_into().unwrap())).collect()
}

/// int64 values packed in a bytes object, read in place (CPython's bytes are 8-byte
/// aligned: an error if these are not).
pub(crate) fn view(raw: &[u8]) -> PyResult<&[i64]> {
    // SAFETY: any 8 bytes are a valid i64; align_to gives the aligned middle part
    let (head, middle, tail) = unsafe { raw.align_to::<i64>() };
    if !head.is_empty() || !tail.is_empty() {
        return Err(pyo3::exceptions::PyValueError::new_err("int64 arrays are not 8-byte aligned"));
    }
    Ok(middle)
}

/// Sweep the functions whose bytes lie at `offsets` (int64, native order) in `data`,
/// `sizes` long, at `addresses`. `kinds`: the Sweep kinds (plain, call, jump, branch,
/// return, other). Returns (edges, rows, kinds, targets, marked, counts) as bytes:
/// int64 arrays (kinds: uint8) of every function's in turn, and three counts per
/// function (edges, rows, marked; edges -1 where it could not decode).
#[pyfunction]
fn sweep_functions<'py>(
    py: Python<'py>,
    data: &[u8],
    offsets: &[u8],
    sizes: &[u8],
    addresses: &[u8],
    kinds: (u8, u8, u8, u8, u8, u8),
) -> PyResult<Vec<Bound<'py, PyBytes>>> {
    let (offsets, sizes, addresses) = (int64s(offsets), int64s(sizes), int64s(addresses));
    if offsets.len() != sizes.len() || offsets.len() != addresses.len() {
        return Err(pyo3::exceptions::PyValueError::new_err("offsets, sizes and addresses differ in length"));
    }
    for (&o, &s) in offsets.iter().zip(&sizes) {
        if o < 0 || s < 0 || (o as u64).saturating_add(s as u64) > data.len() as u64 {
            return Err(pyo3::exceptions::PyValueError::new_err("a function's bytes lie outside the data"));
        }
    }
    let k = Kinds { plain: kinds.0, call: kinds.1, jump: kinds.2, branch: kinds.3, ret: kinds.4, other: kinds.5 };
    let out = py.detach(|| {
        // (the functions in a few runs of about equal bytes, one thread each: node's
        // 78,000 functions take half the time on two cores; the runs' arrays are then
        // joined in order, so the result is a single thread's)
        let runs = runs_of(&sizes, threads_for(&sizes));
        let sweep_run = |(first, end): (usize, usize)| {
            let mut out = Sweeps::default();
            for i in first..end {
                let (o, s) = (offsets[i] as usize, sizes[i] as usize);
                out.sweep(&data[o..o + s], addresses[i] as u64, &k);
            }
            out
        };
        if runs.len() == 1 {
            // (no thread for one run: most calls are one function's, swept as it is asked)
            return vec![sweep_run(runs[0])];
        }
        std::thread::scope(|scope| {
            let handles: Vec<_> = runs
                .iter()
                .map(|&run| scope.spawn(move || sweep_run(run)))
                .collect();
            // (a thread's panic message, not only that there was one: the caller's
            // error says what went wrong)
            let swept: Vec<Sweeps> = handles
                .into_iter()
                .map(|h| h.join().unwrap_or_else(|payload| panic!("a sweep thread panicked: {}", panic_text(&payload))))
                .collect();
            swept
        })
    });
    Ok(vec![
        joined(py, &out, |s| &s.edges),
        joined(py, &out, |s| &s.rows),
        joined(py, &out, |s| &s.kinds),
        joined(py, &out, |s| &s.targets),
        joined(py, &out, |s| &s.marked),
        joined(py, &out, |s| &s.counts),
    ])
}

/// The addresses a function's code computes, in order, as X86_64Backend.computed_addresses
/// finds them with the Python package: the target of each RIP-relative `lea`, and each
/// immediate of 0x1000 or more that a `mov` puts in a register (as the register holds
/// it), up to the first instruction that does not decode. (Here, because the Python loop
/// over every function with an indirect jump that is no table was too slow on big
/// files: docs/benchmarks.md section 11.)
#[pyfunction]
fn computed_addresses(py: Python<'_>, code: &[u8], address: u64) -> Vec<u64> {
    py.detach(|| {
        let mut decoder = Decoder::with_ip(64, code, address, DecoderOptions::NONE);
        let mut insn = Instruction::default();
        let mut found = Vec::new();
        while decoder.can_decode() {
            decoder.decode_out(&mut insn);
            match insn.mnemonic() {
                Mnemonic::Lea => {
                    if insn.memory_base() == Register::RIP {
                        found.push(insn.ip_rel_memory_address());
                    }
                }
                Mnemonic::Mov => {
                    let bits = match insn.op1_kind() {
                        OpKind::Immediate8 => 8,
                        OpKind::Immediate16 | OpKind::Immediate8to16 => 16,
                        OpKind::Immediate32 | OpKind::Immediate8to32 => 32,
                        OpKind::Immediate64 | OpKind::Immediate8to64 | OpKind::Immediate32to64 => 64,
                        _ => 0,
                    };
                    if bits != 0 && insn.op0_kind() == OpKind::Register {
                        let mask = if bits == 64 { u64::MAX } else { (1u64 << bits) - 1 };
                        let value = insn.immediate(1) & mask;
                        if value >= 0x1000 {
                            found.push(value);
                        }
                    }
                }
                Mnemonic::INVALID => break,
                _ => {}
            }
        }
        found
    })
}

/// Whether a function reads its own return address (return_address.rs): (what, where),
/// or None where the Python code must answer.
#[pyfunction]
fn return_address_problem(py: Python<'_>, code: &[u8], address: u64) -> Option<(u8, u64)> {
    py.detach(|| return_address::problem(code, address))
}

#[pymodule]
fn native_sweep(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(sweep_functions, m)?)?;
    m.add_function(wrap_pyfunction!(computed_addresses, m)?)?;
    m.add_function(wrap_pyfunction!(return_address_problem, m)?)?;
    m.add("RETURN_ADDRESS_FINE", return_address::FINE)?;
    m.add("RETURN_ADDRESS_JUMPS_TO_ENTRY", return_address::JUMPS_TO_ENTRY)?;
    m.add("RETURN_ADDRESS_READS", return_address::READS)?;
    m.add("RETURN_ADDRESS_POPS", return_address::POPS)?;
    m.add_class::<sweep_search::SweepSearch>()?;
    m.add_class::<stub_places::StubPlaces>()?;
    Ok(())
}
