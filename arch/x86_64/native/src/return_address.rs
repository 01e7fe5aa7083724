//! Whether an x86_64 function reads its own return address: the rules of
//! arch/x86_64/return_address.py (`problem`), over iced-x86's decode instead of
//! Capstone's detailed one, whose Python binding builds each instruction's operands
//! slowly. The Python file is the reference.
//!
//! It answers only where the decode means what Capstone's does there. A function that
//! holds an instruction whose flow is not mirrored here (far jumps and calls, xbegin,
//! rsm, ud0, an opcode iced-x86 refuses before its end: Capstone takes some) is left to
//! the Python code. tests/test_native_sweep.py holds the two to the same answers on
//! every function of system files.

use std::collections::HashMap;

use iced_x86::{
    Code, Decoder, DecoderError, DecoderOptions, FlowControl, Instruction, InstructionInfoFactory,
    Mnemonic, OpAccess, OpKind, Register,
};

/// What was found, for the Python code to word (return_address.py keeps the wording).
pub const FINE: u8 = 0;
pub const JUMPS_TO_ENTRY: u8 = 1;
pub const READS: u8 = 2;
pub const POPS: u8 = 3;

/// An instruction's flow, as Capstone's groups (jump, call, ret, int, iret) tell it.
#[derive(Clone, Copy)]
enum Flow {
    Plain,
    Call,                 // the callee pops what the call pushed: on to the next one
    End,                  // ret, iret, int, syscall: nothing follows on this path
    Jump(Option<u64>),    // jmp, its target where it is direct
    Branch(Option<u64>),  // jcc, loop, jrcxz: the target and the next one
}

fn far(code: Code) -> bool {
    matches!(code, Code::Jmp_m1616 | Code::Jmp_m1632 | Code::Jmp_m1664 |
             Code::Call_m1616 | Code::Call_m1632 | Code::Call_m1664)
}

/// The flow, or None where this mirror is unsure of what Capstone says.
fn flow(insn: &Instruction) -> Option<Flow> {
    let direct = || (insn.op0_kind() == OpKind::NearBranch64).then(|| insn.near_branch_target());
    match insn.flow_control() {
        FlowControl::Next => Some(Flow::Plain),
        FlowControl::UnconditionalBranch if insn.mnemonic() == Mnemonic::Jmp => {
            direct().map(|target| Flow::Jump(Some(target)))
        }
        FlowControl::ConditionalBranch if insn.mnemonic() != Mnemonic::Xbegin => {
            direct().map(|target| Flow::Branch(Some(target)))
        }
        FlowControl::IndirectBranch if insn.mnemonic() == Mnemonic::Jmp && !far(insn.code()) => {
            Some(Flow::Jump(None))
        }
        FlowControl::Call | FlowControl::IndirectCall
            if insn.mnemonic() == Mnemonic::Call && !far(insn.code()) => Some(Flow::Call),
        FlowControl::Call if insn.mnemonic() == Mnemonic::Syscall => Some(Flow::End),
        FlowControl::Return if matches!(insn.mnemonic(), Mnemonic::Ret | Mnemonic::Retf |
                                        Mnemonic::Iret | Mnemonic::Iretd | Mnemonic::Iretq) => {
            Some(Flow::End)
        }
        FlowControl::Interrupt if matches!(insn.mnemonic(), Mnemonic::Int | Mnemonic::Int1 |
                                           Mnemonic::Int3) => Some(Flow::End),
        FlowControl::Exception if insn.mnemonic() == Mnemonic::Ud2 => Some(Flow::Plain),
        _ => None,
    }
}

/// Whether an operand of `insn` is memory at [base + displacement] with no index.
fn reads_at(insn: &Instruction, base: Register, displacement: i64) -> bool {
    (0..insn.op_count()).any(|k| insn.op_kind(k) == OpKind::Memory)
        && insn.memory_base() == base
        && insn.memory_index() == Register::None
        && insn.memory_displacement64() as i64 == displacement
}

fn is_immediate(kind: OpKind) -> bool {
    matches!(kind, OpKind::Immediate8 | OpKind::Immediate8_2nd | OpKind::Immediate16 |
             OpKind::Immediate32 | OpKind::Immediate64 | OpKind::Immediate8to16 |
             OpKind::Immediate8to32 | OpKind::Immediate8to64 | OpKind::Immediate32to64)
}

/// Bytes `insn` pushes (negative: pops), or None when rsp changes otherwise.
fn stack_change(insn: &Instruction, info: &mut InstructionInfoFactory) -> Option<i64> {
    match insn.mnemonic() {
        Mnemonic::Push | Mnemonic::Pushfq => return Some(8),
        Mnemonic::Pop | Mnemonic::Popfq => return Some(-8),
        _ => {}
    }
    let writes_rsp = insn.op_count() > 0
        && insn.op0_kind() == OpKind::Register
        && insn.op0_register() == Register::RSP
        && matches!(info.info(insn).op0_access(),
                    OpAccess::Write | OpAccess::CondWrite | OpAccess::ReadWrite |
                    OpAccess::ReadCondWrite);
    if !writes_rsp {
        return Some(0);
    }
    match insn.mnemonic() {
        Mnemonic::Sub | Mnemonic::Add if insn.op_count() == 2 && is_immediate(insn.op1_kind()) => {
            let value = insn.immediate(1) as i64;
            Some(if insn.mnemonic() == Mnemonic::Sub { value } else { -value })
        }
        Mnemonic::Lea if insn.memory_base() == Register::RSP
            && insn.memory_index() == Register::None => Some(-(insn.memory_displacement64() as i64)),
        _ => None,
    }
}

/// (what, where): FINE, or the kind of problem and the instruction's address; None
/// where the Python code must answer (see the module's comment).
pub fn problem(code: &[u8], address: u64) -> Option<(u8, u64)> {
    let mut decoder = Decoder::with_ip(64, code, address, DecoderOptions::NONE);
    let mut insns = Vec::new();
    let mut flows = Vec::new();
    let mut insn = Instruction::default();
    while decoder.can_decode() {
        decoder.decode_out(&mut insn);
        if insn.is_invalid() {
            // Capstone stops there too where the code ends mid-instruction; an
            // opcode iced-x86 refuses, Capstone may not
            if decoder.last_error() == DecoderError::NoMoreBytes {
                break;
            }
            return None;
        }
        flows.push(flow(&insn)?);
        insns.push(insn);
    }
    let body = if insns.first().map(|i| i.mnemonic()) == Some(Mnemonic::Endbr64) {
        &insns[1..]
    } else {
        &insns[..]
    };
    let entry = [address, body.first().map_or(address, |i| i.ip())];
    for (insn, flow) in insns.iter().zip(&flows) {
        if let Flow::Jump(Some(target)) | Flow::Branch(Some(target)) = flow {
            if entry.contains(target) {
                return Some((JUMPS_TO_ENTRY, insn.ip()));
            }
        }
    }
    let framed = body.len() >= 2
        && body[0].mnemonic() == Mnemonic::Push && body[0].op_count() == 1
        && body[0].op0_kind() == OpKind::Register && body[0].op0_register() == Register::RBP
        && body[1].mnemonic() == Mnemonic::Mov && body[1].op_count() == 2
        && body[1].op0_kind() == OpKind::Register && body[1].op0_register() == Register::RBP
        && body[1].op1_kind() == OpKind::Register && body[1].op1_register() == Register::RSP;
    if framed {
        if let Some(insn) = insns.iter().find(|i| reads_at(i, Register::RBP, 8)) {
            return Some((READS, insn.ip()));
        }
    }
    // the stack depth along the paths from the entry, as far as it is known
    let starts: Vec<u64> = insns.iter().map(|i| i.ip()).collect();
    let index = |at: u64| starts.binary_search(&at).ok();
    let mut info = InstructionInfoFactory::new();
    let mut depth_at: HashMap<u64, i64> = HashMap::new();
    let mut pending = Vec::new();
    if !insns.is_empty() {
        depth_at.insert(address, 0);
        pending.push(0usize);
    }
    while let Some(k) = pending.pop() {
        let insn = &insns[k];
        let depth = depth_at[&insn.ip()];
        if reads_at(insn, Register::RSP, depth) {
            return Some((READS, insn.ip()));
        }
        if insn.mnemonic() == Mnemonic::Pop && depth == 0 {
            return Some((POPS, insn.ip()));
        }
        let change = match stack_change(insn, &mut info) {
            Some(change) => change,
            None => continue, // rsp set some other way: the depth is unknown from here
        };
        let following = insn.next_ip();
        let successors: &[Option<u64>] = &match flows[k] {
            Flow::Plain | Flow::Call => [Some(following), None],
            Flow::End | Flow::Jump(None) => [None, None],
            Flow::Jump(Some(target)) => [Some(target), None],
            Flow::Branch(target) => [target, Some(following)],
        };
        for successor in successors.iter().flatten() {
            if let Some(j) = index(*successor) {
                if !depth_at.contains_key(successor) {
                    depth_at.insert(*successor, depth + change);
                    pending.push(j);
                }
            }
        }
    }
    Some((FINE, 0))
}
