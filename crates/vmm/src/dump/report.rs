//! The failure report's contents, built from vCPU captures and guest
//! memory: registers and pending events, where RIP, the stack, CR2, the
//! IDT, GDT and TSS are in guest-physical memory (through the guest's own
//! page tables), the bytes around RIP and on the stack, and for each page
//! involved (page-table pages included) whether it is in memory, its
//! checksum, and — in a migrated-in VM — how and when it arrived and
//! whether it is still what the source had.
//!
//! Pure over [`GuestPages`], so it is unit-tested with a fake memory.

use std::collections::BTreeMap;

use arch::translate::{translate, PagingRegs, WalkEnd};
use kvm_bindings::{kvm_lapic_state, kvm_segment, kvm_vcpu_events};
use serde::Serialize;

use super::capture::VcpuCapture;
use crate::migration::history::{page_crc, PageHistory, PageRecord};
use crate::snapshot::state::SerialRegisters;

const PAGE: u64 = 4096;

/// Reading guest-physical memory for a report.
#[derive(Debug, PartialEq, Eq)]
pub enum PageRead {
    Read,
    /// Not guest RAM (MMIO, the hole, past the end).
    NotRam,
    /// RAM that is not in memory here: never written, or (postcopy) still
    /// on the source. Reading it would fault, and under postcopy wait.
    NotInMemory,
}

pub trait GuestPages {
    /// Fills `buf` from guest-physical `address` (the range stays inside
    /// one page) if that page is RAM in memory here.
    fn read(&self, address: u64, buf: &mut [u8]) -> PageRead;
}

/// Everything a report is built from.
pub struct ReportInput<'a> {
    pub reason: String,
    pub captures: Vec<VcpuCapture>,
    pub memory: &'a dyn GuestPages,
    /// A migrated-in VM's page history.
    pub history: Option<&'a PageHistory>,
    pub console_tail: String,
    pub com1: Option<SerialRegisters>,
    pub ioapic: Vec<IoapicPin>,
    pub migration: Option<serde_json::Value>,
    pub threads: Vec<String>,
}

/// The report written to `--dump-dir`.
#[derive(Serialize)]
pub struct DumpReport {
    pub reason: String,
    /// One line: the failed vCPU's RIP and what its page says.
    pub summary: String,
    pub written_at_unix_ms: u64,
    pub hakoniwa: &'static str,
    pub vcpus: Vec<VcpuReport>,
    /// Every page a vCPU's translations touched, by address.
    pub pages: Vec<PageReport>,
    /// The guest's last console output.
    pub console_tail: String,
    pub com1: Option<SerialRegisters>,
    /// The IOAPIC's pins in use (an unmasked or pending one).
    pub ioapic: Vec<IoapicPin>,
    /// The newest migration's report, if the VM came in or went out by one.
    pub migration: Option<serde_json::Value>,
    /// The VMM's threads: name, state, where the kernel has them waiting.
    pub threads: Vec<String>,
}

#[derive(Serialize)]
pub struct VcpuReport {
    pub index: u8,
    pub exit: String,
    pub mp_state: Option<&'static str>,
    pub paging: Option<&'static str>,
    pub regs: BTreeMap<&'static str, String>,
    pub control: BTreeMap<&'static str, String>,
    pub segments: BTreeMap<&'static str, String>,
    pub events: Option<EventsReport>,
    pub lapic: Option<LapicReport>,
    pub translations: Vec<Translation>,
    /// Up to 32 bytes before RIP, the byte at RIP in brackets, and up to 31
    /// after (within RIP's page).
    pub code: Option<String>,
    /// The 16 qwords from RSP on (within its page).
    pub stack: Vec<String>,
    pub errors: Vec<String>,
    /// Set when the registers are not the failure's: KVM on AMD resets a
    /// vCPU at a shutdown intercept (its VMCB is undefined after one), so
    /// a triple-faulted vCPU reads as just after INIT.
    pub state_note: Option<&'static str>,
}

/// What `state_note` says when KVM reset the vCPU at a shutdown.
pub const RESET_AT_SHUTDOWN: &str =
    "KVM reset this vCPU at the shutdown intercept (AMD SVM does: the VMCB is undefined after a shutdown), so its registers are INIT's, not the fault's; the KVM trace (kvm_exit, kvm_inj_exception) has the last RIPs and exceptions";

#[derive(Serialize)]
pub struct EventsReport {
    pub exception: Option<String>,
    pub interrupt: Option<String>,
    pub nmi: String,
    pub interrupt_shadow: u8,
    pub triple_fault_pending: bool,
}

#[derive(Serialize)]
pub struct LapicReport {
    pub tpr: String,
    pub ppr: String,
    /// Vectors in service and requested.
    pub isr: Vec<u8>,
    pub irr: Vec<u8>,
    pub lvt_timer: String,
    pub timer_initial: u32,
    pub timer_current: u32,
}

/// One IOAPIC pin: its redirection entry, decoded.
#[derive(Clone, Debug, Serialize)]
pub struct IoapicPin {
    pub pin: u8,
    pub vector: u8,
    pub masked: bool,
    pub level: bool,
    pub remote_irr: bool,
    pub delivery_status: bool,
    pub dest: u8,
    /// The pin's line is asserted (the IOAPIC's IRR bit).
    pub irr: bool,
}

#[derive(Serialize)]
pub struct Translation {
    /// What was translated: rip, rsp, cr2, idt, gdt, tss.
    pub what: &'static str,
    pub linear: String,
    pub physical: Option<String>,
    /// How the walk ended, in words.
    pub result: String,
    /// The entries read: "L4 0x1000[0x1ff] = 0x2003".
    pub tables: Vec<String>,
}

#[derive(Serialize)]
pub struct PageReport {
    pub address: String,
    /// Why it is listed: "vcpu0 rip", "vcpu0 rip L2 table", ...
    pub roles: Vec<String>,
    pub in_memory: bool,
    pub crc32: Option<u32>,
    pub zero: Option<bool>,
    pub migration: Option<PageRecord>,
    /// The page now equals the source's copy at the switch-over
    /// (`--verify-pages` only; a page the guest wrote since differs too).
    pub same_as_source: Option<bool>,
    /// The above in words.
    pub verdict: String,
}

/// Builds the report.
pub fn build(input: ReportInput<'_>) -> DumpReport {
    let mut pages: BTreeMap<u64, Vec<String>> = BTreeMap::new();
    let vcpus: Vec<VcpuReport> = input
        .captures
        .iter()
        .map(|c| vcpu_report(c, input.memory, &mut pages))
        .collect();
    let pages: Vec<PageReport> = pages
        .into_iter()
        .map(|(address, roles)| page_report(address, roles, input.memory, input.history))
        .collect();
    let summary = summary(&input.reason, &vcpus, &pages);
    DumpReport {
        reason: input.reason,
        summary,
        written_at_unix_ms: crate::migration::unix_now_ns() / 1_000_000,
        hakoniwa: env!("CARGO_PKG_VERSION"),
        vcpus,
        pages,
        console_tail: input.console_tail,
        com1: input.com1,
        ioapic: input.ioapic,
        migration: input.migration,
        threads: input.threads,
    }
}

fn hex(v: u64) -> String {
    format!("{v:#x}")
}

fn read_u64(memory: &dyn GuestPages, address: u64) -> Option<u64> {
    if address % PAGE > PAGE - 8 {
        return None;
    }
    let mut b = [0u8; 8];
    (memory.read(address, &mut b) == PageRead::Read).then(|| u64::from_le_bytes(b))
}

fn vcpu_report(
    c: &VcpuCapture,
    memory: &dyn GuestPages,
    pages: &mut BTreeMap<u64, Vec<String>>,
) -> VcpuReport {
    let mut report = VcpuReport {
        index: c.index,
        exit: c.exit.clone(),
        mp_state: c.mp_state.map(mp_state_name),
        paging: None,
        regs: BTreeMap::new(),
        control: BTreeMap::new(),
        segments: BTreeMap::new(),
        events: c.events.as_ref().map(events_report),
        lapic: c.lapic.as_ref().map(lapic_report),
        translations: Vec::new(),
        code: None,
        stack: Vec::new(),
        errors: c.errors.clone(),
        state_note: None,
    };
    if let Some(r) = &c.regs {
        for (name, v) in [
            ("rax", r.rax),
            ("rbx", r.rbx),
            ("rcx", r.rcx),
            ("rdx", r.rdx),
            ("rsi", r.rsi),
            ("rdi", r.rdi),
            ("rsp", r.rsp),
            ("rbp", r.rbp),
            ("r8", r.r8),
            ("r9", r.r9),
            ("r10", r.r10),
            ("r11", r.r11),
            ("r12", r.r12),
            ("r13", r.r13),
            ("r14", r.r14),
            ("r15", r.r15),
            ("rip", r.rip),
            ("rflags", r.rflags),
        ] {
            report.regs.insert(name, hex(v));
        }
    }
    let Some(s) = &c.sregs else {
        return report;
    };
    let after_init = c.regs.is_some_and(|r| r.rip == 0xfff0)
        && s.cs.base == 0xffff_0000
        && s.cr0 & (1 << 31) == 0;
    if c.exit.starts_with("shutdown") && after_init {
        report.state_note = Some(RESET_AT_SHUTDOWN);
    }
    for (name, v) in [
        ("cr0", s.cr0),
        ("cr2", s.cr2),
        ("cr3", s.cr3),
        ("cr4", s.cr4),
        ("cr8", s.cr8),
        ("efer", s.efer),
        ("apic_base", s.apic_base),
    ] {
        report.control.insert(name, hex(v));
    }
    for (name, seg) in [
        ("cs", &s.cs),
        ("ds", &s.ds),
        ("es", &s.es),
        ("fs", &s.fs),
        ("gs", &s.gs),
        ("ss", &s.ss),
        ("tr", &s.tr),
        ("ldt", &s.ldt),
    ] {
        report.segments.insert(name, segment(seg));
    }
    report.segments.insert(
        "gdt",
        format!("base {:#x} limit {:#x}", s.gdt.base, s.gdt.limit),
    );
    report.segments.insert(
        "idt",
        format!("base {:#x} limit {:#x}", s.idt.base, s.idt.limit),
    );
    let paging = PagingRegs {
        cr0: s.cr0,
        cr3: s.cr3,
        cr4: s.cr4,
        efer: s.efer,
    };
    report.paging = Some(paging.mode());
    if report.state_note.is_some() {
        // Nothing of the fault is left to walk.
        return report;
    }
    let rip = c.regs.map(|r| s.cs.base.wrapping_add(r.rip));
    let rsp = c.regs.map(|r| s.ss.base.wrapping_add(r.rsp));
    let mut targets: Vec<(&'static str, u64)> = Vec::new();
    targets.extend(rip.map(|v| ("rip", v)));
    targets.extend(rsp.map(|v| ("rsp", v)));
    if s.cr2 != 0 {
        targets.push(("cr2", s.cr2));
    }
    targets.push(("idt", s.idt.base));
    targets.push(("gdt", s.gdt.base));
    if s.tr.base != 0 {
        targets.push(("tss", s.tr.base));
    }
    let prefix = format!("vcpu{}", c.index);
    for (what, linear) in targets {
        let walk = translate(&paging, linear, |a| read_u64(memory, a));
        let mut tables = Vec::new();
        for step in &walk.steps {
            tables.push(format!(
                "L{} {:#x}[{:#x}] = {:#x}",
                step.level,
                step.table,
                (step.entry_address - step.table) / 8,
                step.entry
            ));
            pages
                .entry(step.table)
                .or_default()
                .push(format!("{prefix} {what} L{} table", step.level));
        }
        let result = match walk.end {
            WalkEnd::Mapped { physical, .. } => {
                pages
                    .entry(physical & !(PAGE - 1))
                    .or_default()
                    .push(format!("{prefix} {what}"));
                "mapped".to_string()
            }
            WalkEnd::NotPresent { level } => format!("not present at L{level}"),
            WalkEnd::Unreadable { address } => {
                pages
                    .entry(address & !(PAGE - 1))
                    .or_default()
                    .push(format!("{prefix} {what} table (unreadable)"));
                format!("table entry at {address:#x} not in memory")
            }
            WalkEnd::Unsupported(mode) => format!("{mode} paging not followed"),
        };
        let physical = walk.physical();
        if what == "rip" {
            report.code = physical.and_then(|p| code_bytes(memory, p));
        }
        if what == "rsp" {
            report.stack = physical.map(|p| stack_words(memory, p)).unwrap_or_default();
        }
        report.translations.push(Translation {
            what,
            linear: hex(linear),
            physical: physical.map(hex),
            result,
            tables,
        });
    }
    report
}

/// The bytes around guest-physical `rip`, inside its page.
fn code_bytes(memory: &dyn GuestPages, rip: u64) -> Option<String> {
    let page = rip & !(PAGE - 1);
    let from = rip.saturating_sub(32).max(page);
    let to = (rip + 32).min(page + PAGE);
    let mut buf = vec![0u8; (to - from) as usize];
    if memory.read(from, &mut buf) != PageRead::Read {
        return None;
    }
    Some(
        buf.iter()
            .enumerate()
            .map(|(i, b)| {
                if from + i as u64 == rip {
                    format!("[{b:02x}]")
                } else {
                    format!("{b:02x}")
                }
            })
            .collect::<Vec<_>>()
            .join(" "),
    )
}

/// Up to 16 qwords from guest-physical `rsp`, inside its page.
fn stack_words(memory: &dyn GuestPages, rsp: u64) -> Vec<String> {
    (0..16)
        .map(|i| rsp + 8 * i)
        .map_while(|a| read_u64(memory, a))
        .map(hex)
        .collect()
}

fn page_report(
    address: u64,
    roles: Vec<String>,
    memory: &dyn GuestPages,
    history: Option<&PageHistory>,
) -> PageReport {
    let mut bytes = vec![0u8; PAGE as usize];
    let read = memory.read(address, &mut bytes);
    let in_memory = read == PageRead::Read;
    let crc32 = in_memory.then(|| page_crc(&bytes));
    let zero = in_memory.then(|| bytes.iter().all(|&b| b == 0));
    let record = history.and_then(|h| {
        h.layout()
            .index_of_page(address / PAGE)
            .and_then(|i| h.record(i))
    });
    // A page not in memory reads as zero once touched.
    let now = crc32
        .or_else(|| (read == PageRead::NotInMemory).then(crate::migration::history::zero_page_crc));
    let same_as_source = record
        .as_ref()
        .and_then(|r| r.source_crc32)
        .zip(now)
        .map(|(source, now)| source == now);
    let verdict = match (&read, &record) {
        (PageRead::NotRam, _) => "not RAM".to_string(),
        (_, Some(r)) if r.arrived == "never" => {
            if in_memory {
                "in memory, but no migration frame brought it".to_string()
            } else {
                "never arrived from the source".to_string()
            }
        }
        (_, Some(r)) => {
            let how = format!(
                "arrived by {}{} at {} ms{}",
                r.arrived,
                if r.zero { " (zero)" } else { "" },
                r.at_ms.unwrap_or(0),
                if r.discarded_at_switchover {
                    ", after the switch-over dropped its precopy copy"
                } else {
                    ""
                }
            );
            match same_as_source {
                Some(true) => format!("{how}; same as the source's copy"),
                Some(false) => format!(
                    "{how}; differs from the source's copy (the guest wrote it since, or it arrived wrong)"
                ),
                None => how,
            }
        }
        (PageRead::Read, None) => "in memory".to_string(),
        (PageRead::NotInMemory, None) => "not in memory (never written)".to_string(),
    };
    PageReport {
        address: hex(address),
        roles,
        in_memory,
        crc32,
        zero,
        migration: record,
        same_as_source,
        verdict,
    }
}

/// One line for stderr: the failed (or first) vCPU's RIP and its page.
fn summary(reason: &str, vcpus: &[VcpuReport], pages: &[PageReport]) -> String {
    let Some(v) = vcpus
        .iter()
        .find(|v| v.exit != "stopped" && v.exit != "paused")
        .or(vcpus.first())
    else {
        return reason.to_string();
    };
    let mut line = format!("{reason}: vCPU {} ({})", v.index, v.exit);
    if v.state_note.is_some() {
        return line + "; its registers are lost: KVM reset it at the shutdown (AMD)";
    }
    if let Some(rip) = v.translations.iter().find(|t| t.what == "rip") {
        line += &format!(" at RIP {}", rip.linear);
        match &rip.physical {
            Some(p) => {
                let page =
                    u64::from_str_radix(p.trim_start_matches("0x"), 16).unwrap_or(0) & !(PAGE - 1);
                let verdict = pages
                    .iter()
                    .find(|r| r.address == hex(page))
                    .map(|r| r.verdict.as_str())
                    .unwrap_or("");
                line += &format!(" (guest-physical {p}: {verdict})");
            }
            None => line += &format!(" ({})", rip.result),
        }
    }
    if let Some(cr2) = v.control.get("cr2") {
        line += &format!(", CR2 {cr2}");
    }
    if let Some(e) = v.events.as_ref().and_then(|e| e.exception.as_ref()) {
        line += &format!(", {e}");
    }
    line
}

fn segment(s: &kvm_segment) -> String {
    format!(
        "sel {:#x} base {:#x} limit {:#x} type {} dpl {} p {} l {} db {}{}",
        s.selector,
        s.base,
        s.limit,
        s.type_,
        s.dpl,
        s.present,
        s.l,
        s.db,
        if s.unusable != 0 { " unusable" } else { "" }
    )
}

fn mp_state_name(state: u32) -> &'static str {
    match state {
        0 => "runnable",
        1 => "uninitialized",
        2 => "init_received",
        3 => "halted",
        4 => "sipi_received",
        5 => "stopped",
        6 => "check_stop",
        7 => "operating",
        8 => "load",
        9 => "ap_reset_hold",
        _ => "unknown",
    }
}

fn exception_name(vector: u8) -> String {
    let name = match vector {
        0 => "#DE",
        1 => "#DB",
        2 => "NMI",
        3 => "#BP",
        4 => "#OF",
        5 => "#BR",
        6 => "#UD",
        7 => "#NM",
        8 => "#DF",
        10 => "#TS",
        11 => "#NP",
        12 => "#SS",
        13 => "#GP",
        14 => "#PF",
        16 => "#MF",
        17 => "#AC",
        18 => "#MC",
        19 => "#XM",
        20 => "#VE",
        21 => "#CP",
        _ => return format!("vector {vector}"),
    };
    name.to_string()
}

fn events_report(e: &kvm_vcpu_events) -> EventsReport {
    let x = &e.exception;
    let exception = (x.injected != 0 || x.pending != 0).then(|| {
        format!(
            "{} {}{}{}",
            exception_name(x.nr),
            if x.injected != 0 {
                "injected"
            } else {
                "pending"
            },
            if x.has_error_code != 0 {
                format!(" error code {:#x}", x.error_code)
            } else {
                String::new()
            },
            if e.exception_has_payload != 0 {
                format!(" payload {:#x}", e.exception_payload)
            } else {
                String::new()
            }
        )
    });
    let i = &e.interrupt;
    let interrupt = (i.injected != 0).then(|| {
        format!(
            "vector {:#x} injected{}",
            i.nr,
            if i.soft != 0 { " (soft)" } else { "" }
        )
    });
    EventsReport {
        exception,
        interrupt,
        nmi: format!(
            "injected {} pending {} masked {}",
            e.nmi.injected, e.nmi.pending, e.nmi.masked
        ),
        interrupt_shadow: i.shadow,
        triple_fault_pending: e.triple_fault.pending != 0,
    }
}

fn lapic_report(l: &kvm_lapic_state) -> LapicReport {
    let reg = |offset: usize| -> u32 {
        let b = &l.regs[offset..offset + 4];
        u32::from_le_bytes([b[0] as u8, b[1] as u8, b[2] as u8, b[3] as u8])
    };
    // ISR and IRR: eight 32-bit registers 16 bytes apart, vector 32*i + bit.
    let vectors = |base: usize| -> Vec<u8> {
        (0..8)
            .flat_map(|i| {
                let word = reg(base + 16 * i);
                (0..32)
                    .filter(move |b| word & (1 << b) != 0)
                    .map(move |b| (32 * i + b) as u8)
            })
            .collect()
    };
    let lvt = reg(0x320);
    LapicReport {
        tpr: hex(u64::from(reg(0x80))),
        ppr: hex(u64::from(reg(0xa0))),
        isr: vectors(0x100),
        irr: vectors(0x200),
        lvt_timer: format!(
            "vector {:#x} mode {} masked {}",
            lvt & 0xff,
            match (lvt >> 17) & 3 {
                0 => "one-shot",
                1 => "periodic",
                2 => "tsc-deadline",
                _ => "reserved",
            },
            (lvt >> 16) & 1
        ),
        timer_initial: reg(0x380),
        timer_current: reg(0x390),
    }
}

/// Decodes the IOAPIC's redirection table (KVM_GET_IRQCHIP, chip 2): the
/// pins that are unmasked or asserted.
pub fn ioapic_pins(state: &kvm_bindings::kvm_ioapic_state) -> Vec<IoapicPin> {
    // SAFETY: reading the `fields` view of a u64 bitfield union, which
    // every bit pattern is a valid value of.
    let entries: Vec<u64> = state.redirtbl.iter().map(|e| unsafe { e.bits }).collect();
    entries
        .iter()
        .enumerate()
        .filter_map(|(pin, &e)| {
            let irr = state.irr & (1 << pin) != 0;
            let masked = e & (1 << 16) != 0;
            (!masked || irr).then_some(IoapicPin {
                pin: pin as u8,
                vector: (e & 0xff) as u8,
                masked,
                level: e & (1 << 15) != 0,
                remote_irr: e & (1 << 14) != 0,
                delivery_status: e & (1 << 12) != 0,
                dest: (e >> 56) as u8,
                irr,
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::migration::pages::RamLayout;
    use crate::migration::protocol::PageKind;
    use kvm_bindings::{kvm_regs, kvm_sregs};
    use std::collections::HashMap;

    /// Guest memory as a map of present pages.
    struct FakeMemory(HashMap<u64, Vec<u8>>);

    impl FakeMemory {
        fn write_u64(&mut self, address: u64, value: u64) {
            let page = self
                .0
                .entry(address & !(PAGE - 1))
                .or_insert_with(|| vec![0; PAGE as usize]);
            let at = (address % PAGE) as usize;
            page[at..at + 8].copy_from_slice(&value.to_le_bytes());
        }
    }

    impl GuestPages for FakeMemory {
        fn read(&self, address: u64, buf: &mut [u8]) -> PageRead {
            if address >= 0x100_0000 {
                return PageRead::NotRam;
            }
            match self.0.get(&(address & !(PAGE - 1))) {
                Some(page) => {
                    let at = (address % PAGE) as usize;
                    buf.copy_from_slice(&page[at..at + buf.len()]);
                    PageRead::Read
                }
                None => PageRead::NotInMemory,
            }
        }
    }

    fn long_mode_capture(rip: u64, rsp: u64) -> VcpuCapture {
        let mut sregs = kvm_sregs {
            cr0: 0x8000_0011,
            cr3: 0x1000,
            cr4: 0x20,
            efer: 0x500,
            cr2: 0xdead_b000,
            ..Default::default()
        };
        sregs.idt.base = 0x5000;
        VcpuCapture {
            index: 0,
            exit: "shutdown (triple fault)".into(),
            regs: Some(kvm_regs {
                rip,
                rsp,
                ..Default::default()
            }),
            sregs: Some(sregs),
            events: Some(kvm_vcpu_events {
                exception: kvm_bindings::kvm_vcpu_events__bindgen_ty_1 {
                    injected: 0,
                    nr: 14,
                    has_error_code: 1,
                    pending: 1,
                    error_code: 0x10,
                },
                ..Default::default()
            }),
            mp_state: Some(0),
            lapic: None,
            errors: vec![],
        }
    }

    #[test]
    fn a_report_follows_rip_through_the_page_tables_and_says_where_pages_came_from() {
        // Identity-mapped 2 MiB page for the low 2 MiB (PML4 0x1000 →
        // PDPT 0x2000 → PD 0x3000), RIP at 0x7010; the stack's page (0x9000)
        // never arrived.
        let mut mem = FakeMemory(HashMap::new());
        mem.write_u64(0x1000, 0x2003);
        mem.write_u64(0x2000, 0x3003);
        mem.write_u64(0x3000, 0x83); // 2 MiB page at 0, present + PS
        mem.write_u64(0x7010, 0x9090_9090_0f0b_0f0b); // ud2; ud2; nop...
        mem.write_u64(0x5000, 0); // the IDT page is in memory
        let memory =
            crate::memory::GuestMemoryMmap::from_ranges(&[(vm_memory::GuestAddress(0), 0x10_0000)])
                .unwrap();
        let history = PageHistory::new(RamLayout::new(&memory));
        history.arrived(PageKind::Demand, 7, 1, false);
        history.arrived(PageKind::Background, 1, 3, false);
        let crc_of = |address: u64| mem.0.get(&address).map(|p| page_crc(p));
        let mut crcs = vec![crate::migration::history::zero_page_crc(); 256];
        crcs[7] = crc_of(0x7000).unwrap();
        crcs[1] = 1; // the PML4 page changed since the source had it
        crcs[9] = 12345; // the stack page, still on the source
        assert!(history.set_source_crcs(crcs));

        let report = build(ReportInput {
            reason: "the guest triple-faulted".into(),
            captures: vec![long_mode_capture(0x7010, 0x9ff8)],
            memory: &mem,
            history: Some(&history),
            console_tail: "last words".into(),
            com1: None,
            ioapic: vec![],
            migration: None,
            threads: vec![],
        });
        let v = &report.vcpus[0];
        assert_eq!(v.paging, Some("4-level"));
        let rip = &v.translations[0];
        assert_eq!((rip.what, rip.physical.as_deref()), ("rip", Some("0x7010")));
        assert_eq!(rip.tables.len(), 3, "{:?}", rip.tables);
        assert_eq!(rip.tables[0], "L4 0x1000[0x0] = 0x2003");
        assert!(
            v.code.as_deref().unwrap().contains("[0b] 0f 0b 0f 90"),
            "{:?}",
            v.code
        );
        assert_eq!(
            v.events.as_ref().unwrap().exception.as_deref(),
            Some("#PF pending error code 0x10")
        );
        let page = |a: &str| report.pages.iter().find(|p| p.address == a).unwrap();
        let code = page("0x7000");
        assert_eq!(code.same_as_source, Some(true));
        assert!(
            code.verdict.starts_with("arrived by demand at"),
            "{}",
            code.verdict
        );
        assert!(code.roles.contains(&"vcpu0 rip".to_string()));
        let pml4 = page("0x1000");
        assert_eq!(pml4.same_as_source, Some(false));
        assert!(pml4.roles.iter().any(|r| r == "vcpu0 rip L4 table"));
        let stack = page("0x9000");
        assert!(!stack.in_memory);
        assert_eq!(stack.verdict, "never arrived from the source");
        assert!(v.stack.is_empty());
        assert!(
            report.summary.starts_with(
                "the guest triple-faulted: vCPU 0 (shutdown (triple fault)) at RIP 0x7010 (guest-physical 0x7010: arrived by demand"
            ),
            "{}",
            report.summary
        );
        assert!(report
            .summary
            .ends_with("CR2 0xdeadb000, #PF pending error code 0x10"));
        // The CR2 address is beyond RAM here: its walk is still reported.
        assert!(v.translations.iter().any(|t| t.what == "cr2"));
    }

    #[test]
    fn a_vcpu_reset_at_its_shutdown_is_said_so_and_not_walked() {
        let mut capture = long_mode_capture(0xfff0, 0);
        let sregs = capture.sregs.as_mut().unwrap();
        sregs.cr0 = 0x60000010;
        sregs.cs.base = 0xffff_0000;
        let report = build(ReportInput {
            reason: "the guest triple-faulted".into(),
            captures: vec![capture],
            memory: &FakeMemory(HashMap::new()),
            history: None,
            console_tail: String::new(),
            com1: None,
            ioapic: vec![],
            migration: None,
            threads: vec![],
        });
        assert_eq!(report.vcpus[0].state_note, Some(RESET_AT_SHUTDOWN));
        assert!(report.vcpus[0].translations.is_empty());
        assert!(report.pages.is_empty());
        assert!(report
            .summary
            .ends_with("its registers are lost: KVM reset it at the shutdown (AMD)"));
    }

    #[test]
    fn lapic_and_ioapic_are_decoded() {
        let mut lapic = kvm_lapic_state::default();
        let mut set = |offset: usize, v: u32| {
            for (i, b) in v.to_le_bytes().iter().enumerate() {
                lapic.regs[offset + i] = *b as _;
            }
        };
        set(0x100 + 16, 1 << 4); // vector 0x24 in service
        set(0x200 + 16 * 7, 1 << 31); // vector 0xff requested
        set(0x320, 0xec | (2 << 17)); // TSC-deadline timer, vector 0xec
        let l = lapic_report(&lapic);
        assert_eq!(l.isr, vec![0x24]);
        assert_eq!(l.irr, vec![0xff]);
        assert_eq!(l.lvt_timer, "vector 0xec mode tsc-deadline masked 0");

        let mut ioapic = kvm_bindings::kvm_ioapic_state::default();
        for e in ioapic.redirtbl.iter_mut() {
            e.bits = 1 << 16; // masked
        }
        ioapic.redirtbl[4].bits = 0x24; // COM1, edge, unmasked
        ioapic.irr = 1 << 9;
        let pins = ioapic_pins(&ioapic);
        assert_eq!(pins.len(), 2);
        assert_eq!(
            (pins[0].pin, pins[0].vector, pins[0].masked),
            (4, 0x24, false)
        );
        assert!(pins[1].masked && pins[1].irr);
    }
}
