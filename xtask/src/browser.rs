//! The browser the dashboard's test drives: headless Chromium and its
//! WebDriver from Debian's packages (`chromium`, `chromium-driver`), installed
//! by `cargo xtask ci` when absent, once.

use std::path::Path;
use std::process::Command;

/// Where Debian puts the WebDriver (the test looks in the same places).
const DRIVERS: [&str; 2] = ["/usr/bin/chromedriver", "/usr/lib/chromium/chromedriver"];

fn present() -> bool {
    DRIVERS.iter().any(|p| Path::new(p).exists())
}

/// Installs `chromium` and `chromium-driver` with apt (through `sudo` when not
/// root) unless the driver is there already.
pub(crate) fn ensure() -> Result<(), String> {
    if present() {
        return Ok(());
    }
    if !Path::new("/usr/bin/apt-get").exists() {
        return Err("the dashboard's browser test needs chromium and chromedriver; install them \
                    (Debian: apt-get install chromium chromium-driver)"
            .into());
    }
    let root = Command::new("id").arg("-u").output().is_ok_and(|o| o.stdout.starts_with(b"0"));
    let apt = |args: &[&str]| -> Result<(), String> {
        let mut c = if root { Command::new("apt-get") } else { Command::new("sudo") };
        if !root {
            c.arg("apt-get");
        }
        eprintln!("$ {}apt-get {}", if root { "" } else { "sudo " }, args.join(" "));
        let status = c.args(args).env("DEBIAN_FRONTEND", "noninteractive").status();
        match status {
            Ok(s) if s.success() => Ok(()),
            Ok(s) => Err(format!("apt-get {} failed ({s})", args.join(" "))),
            Err(e) => Err(format!("cannot run apt-get: {e}")),
        }
    };
    apt(&["update", "-qq"])?;
    apt(&["install", "-y", "-qq", "chromium", "chromium-driver"])?;
    if present() {
        Ok(())
    } else {
        Err("chromium-driver is installed but no chromedriver was found".into())
    }
}
