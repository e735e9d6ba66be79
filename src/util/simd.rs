//! Which vector build the hand-written loops take on this CPU, and the cap `VOXCACHE_SIMD`
//! puts on it.
//!
//! The cache reader's image rows and the augmentation have an AVX2 build and the portable
//! code. Both run the same operations in the same order (nothing fuses a multiply and an add:
//! Rust never contracts them, and no FMA intrinsic is used), so they give the same values bit
//! for bit (`scripts/batch_hashes.sh` hashes the training batches of each); only the number of
//! lanes per instruction differs, and with it the speed. AVX-512 CPUs take the AVX2 build
//! there: the AVX-512 copies of these loops gained 2-7% on micro-benchmarks, under the 10% end
//! to end that a hand-written path must earn.
//!
//! The convolution and normalization kernels (model::ops) have AVX-512 (with AVX512-BF16 for
//! bf16), AVX2 and portable builds, and take the widest the CPU has within [`cap`].
//!
//! `VOXCACHE_SIMD` caps every build, to compare them side by side on one machine:
//! `portable` (no hand-written vector code), `avx2` (no AVX-512 and no bf16 kernels: what a
//! CPU without AVX-512 runs), `avx512` or unset (all the CPU has).

use std::sync::OnceLock;

/// A vector build, narrowest first.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Simd {
    /// Plain Rust (what the compiler makes of it for the target's baseline).
    Portable,
    /// 8 lanes of f32.
    Avx2,
}

/// The widest instruction set `VOXCACHE_SIMD` lets any kernel use, narrowest first.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Cap {
    /// No hand-written vector code.
    Portable,
    /// Up to AVX2 and FMA.
    Avx2,
    /// Everything the CPU has (AVX-512, AVX512-BF16).
    Avx512,
}

/// The cap `VOXCACHE_SIMD` sets (read once per process). A value it does not know is named
/// on stderr once and sets no cap, so that a typo is seen and not taken as a cap.
pub fn cap() -> Cap {
    static CAP: OnceLock<Cap> = OnceLock::new();
    *CAP.get_or_init(|| {
        parse_cap(std::env::var("VOXCACHE_SIMD").ok().as_deref()).unwrap_or_else(|e| {
            eprintln!("warning: {e}");
            Cap::Avx512
        })
    })
}

/// The cap a value of `VOXCACHE_SIMD` names (unset or empty: none).
fn parse_cap(value: Option<&str>) -> Result<Cap, String> {
    match value {
        None | Some("" | "avx512") => Ok(Cap::Avx512),
        Some("avx2") => Ok(Cap::Avx2),
        Some("portable") => Ok(Cap::Portable),
        Some(other) => Err(format!(
            "VOXCACHE_SIMD={other:?} is none of portable, avx2, avx512: no cap set"
        )),
    }
}

/// Whether [`cap`] lets a kernel use the instructions of `level` (the CPU must have them too).
pub fn allows(level: Cap) -> bool {
    level <= cap()
}

/// How the convolutions multiply bf16 values on a CPU with AVX512-BF16.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Bf16Products {
    /// AMX tiles (`tdpbf16ps`: a 16 x 16 block of f32 sums gains 32 products each at once)
    /// for the forward pass and the input gradient, where the CPU has AMX-BF16 and the OS
    /// grants its registers ([`amx_bf16`]); the weight gradient as [`Self::Fma`].
    Tiles,
    /// Two products a lane each step (`vdpbf16ps`), summed in f32.
    Dot,
    /// Widened to f32 as they are read, multiplied and summed by the f32 FMA kernels: the same
    /// products (a product of two bf16 values is exact in f32), summed one at a time.
    Fma,
}

/// How this process multiplies bf16 values where the CPU has AVX512-BF16 (read once).
///
/// AMD's Zen 4 and Zen 5 issue `vdpbf16ps` as fast as an f32 FMA, so it makes twice the
/// products; on Intel's Xeons it runs at under half that rate (measured by `bench_ops` on an
/// Emerald Rapids: 172 GFLOP/s of bf16 dot products against 378 of f32 FMAs on two cores),
/// and the f32 kernels on widened values are faster. Where the CPU has AMX-BF16 (Intel's
/// Xeons since Sapphire Rapids), its tiles make the products of the forward pass and the input
/// gradient. `VOXCACHE_BF16=amx|dot|fma` overrides the rule (`amx` only where [`amx_bf16`]
/// holds; elsewhere the rule stands); a value it does not know is named on stderr once and the
/// rule stands.
pub fn bf16_products() -> Bf16Products {
    static HOW: OnceLock<Bf16Products> = OnceLock::new();
    *HOW.get_or_init(|| {
        let rule = match (amx_bf16(), cpu_vendor_is_intel()) {
            (true, _) => Bf16Products::Tiles,
            (false, true) => Bf16Products::Fma,
            (false, false) => Bf16Products::Dot,
        };
        parse_bf16(std::env::var("VOXCACHE_BF16").ok().as_deref(), rule).unwrap_or_else(|e| {
            eprintln!("warning: {e}");
            rule
        })
    })
}

/// The choice a value of `VOXCACHE_BF16` names (unset or empty: `rule`).
fn parse_bf16(value: Option<&str>, rule: Bf16Products) -> Result<Bf16Products, String> {
    match value {
        None | Some("") => Ok(rule),
        Some("amx") if rule == Bf16Products::Tiles => Ok(rule),
        Some("amx") => Err(format!(
            "VOXCACHE_BF16=\"amx\": this CPU (or its OS) offers no AMX-BF16 tiles: its default ({rule:?}) is kept"
        )),
        Some("dot") => Ok(Bf16Products::Dot),
        Some("fma") => Ok(Bf16Products::Fma),
        Some(other) => Err(format!(
            "VOXCACHE_BF16={other:?} is none of amx, dot, fma: this CPU's default ({rule:?}) is kept"
        )),
    }
}

/// Whether this process may run AMX-BF16 tile instructions (read once): the CPU has AMX-TILE
/// and AMX-BF16 (CPUID leaf 7), AVX512-BF16 beside them, the OS saves the tile registers
/// (XCR0 bits 17 and 18), Linux granted this process their state (`arch_prctl`; without the
/// grant the first tile instruction faults), and `VOXCACHE_SIMD` does not cap AVX-512 off.
pub fn amx_bf16() -> bool {
    static AMX: OnceLock<bool> = OnceLock::new();
    *AMX.get_or_init(|| allows(Cap::Avx512) && amx_granted())
}

#[cfg(all(target_arch = "x86_64", target_os = "linux"))]
fn amx_granted() -> bool {
    use std::arch::x86_64::__cpuid_count;
    let leaf7 = __cpuid_count(7, 0);
    let (tile, bf16) = (leaf7.edx >> 24 & 1 == 1, leaf7.edx >> 22 & 1 == 1);
    let osxsave = __cpuid_count(1, 0).ecx >> 27 & 1 == 1;
    if !(tile && bf16 && osxsave && std::arch::is_x86_feature_detected!("avx512bf16")) {
        return false;
    }
    let xcr0: u64 = {
        let (lo, hi): (u32, u32);
        // SAFETY: OSXSAVE is set, so XGETBV reads XCR0.
        unsafe {
            std::arch::asm!("xgetbv", in("ecx") 0, out("eax") lo, out("edx") hi,
                options(nomem, nostack, preserves_flags));
        }
        u64::from(hi) << 32 | u64::from(lo)
    };
    if xcr0 & (0b11 << 17) != 0b11 << 17 {
        return false;
    }
    // arch_prctl(ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA): the grant holds for the whole
    // process, threads made before and after it.
    const SYS_ARCH_PRCTL: usize = 158;
    const ARCH_REQ_XCOMP_PERM: usize = 0x1023;
    const XFEATURE_XTILEDATA: usize = 18;
    let ret: isize;
    // SAFETY: a system call that changes nothing but this process's permission; the kernel
    // clobbers rcx and r11.
    unsafe {
        std::arch::asm!("syscall", inlateout("rax") SYS_ARCH_PRCTL as isize => ret,
            in("rdi") ARCH_REQ_XCOMP_PERM, in("rsi") XFEATURE_XTILEDATA,
            lateout("rcx") _, lateout("r11") _, options(nostack));
    }
    ret == 0
}

#[cfg(not(all(target_arch = "x86_64", target_os = "linux")))]
fn amx_granted() -> bool {
    false
}

/// Whether the CPU's vendor string (CPUID leaf 0) is Intel's.
fn cpu_vendor_is_intel() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        let r = std::arch::x86_64::__cpuid(0);
        let name: Vec<u8> = [r.ebx, r.edx, r.ecx]
            .iter()
            .flat_map(|v| v.to_le_bytes())
            .collect();
        name == b"GenuineIntel"
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
    }
}

/// The widest build of the reader's and the augmentation's loops this CPU runs, within [`cap`].
pub fn best() -> Simd {
    static BEST: OnceLock<Simd> = OnceLock::new();
    *BEST.get_or_init(|| match cap() {
        Cap::Portable => Simd::Portable,
        _ => detected(),
    })
}

/// The widest build this CPU runs.
pub fn detected() -> Simd {
    #[cfg(target_arch = "x86_64")]
    {
        if std::arch::is_x86_feature_detected!("avx2") {
            return Simd::Avx2;
        }
    }
    Simd::Portable
}

#[cfg(test)]
mod tests {
    use super::{parse_bf16, parse_cap, Bf16Products, Cap};

    #[test]
    fn the_cap_names_and_a_typo() {
        assert_eq!(parse_cap(None), Ok(Cap::Avx512));
        assert_eq!(parse_cap(Some("avx512")), Ok(Cap::Avx512));
        assert_eq!(parse_cap(Some("avx2")), Ok(Cap::Avx2));
        assert_eq!(parse_cap(Some("portable")), Ok(Cap::Portable));
        let e = parse_cap(Some("AVX2")).unwrap_err();
        assert!(
            e.contains("\"AVX2\"") && e.contains("portable, avx2, avx512"),
            "{e}"
        );
        assert!(Cap::Portable < Cap::Avx2 && Cap::Avx2 < Cap::Avx512);
    }

    #[test]
    fn the_bf16_choice_names_and_a_typo() {
        for rule in [Bf16Products::Tiles, Bf16Products::Dot, Bf16Products::Fma] {
            assert_eq!(parse_bf16(None, rule), Ok(rule));
            assert_eq!(parse_bf16(Some(""), rule), Ok(rule));
            assert_eq!(parse_bf16(Some("dot"), rule), Ok(Bf16Products::Dot));
            assert_eq!(parse_bf16(Some("fma"), rule), Ok(Bf16Products::Fma));
        }
        let e = parse_bf16(Some("f32"), Bf16Products::Fma).unwrap_err();
        assert!(e.contains("\"f32\"") && e.contains("(Fma)"), "{e}");
        // Tiles only where the CPU has them.
        assert_eq!(
            parse_bf16(Some("amx"), Bf16Products::Tiles),
            Ok(Bf16Products::Tiles)
        );
        let e = parse_bf16(Some("amx"), Bf16Products::Dot).unwrap_err();
        assert!(e.contains("no AMX-BF16") && e.contains("(Dot)"), "{e}");
    }
}
