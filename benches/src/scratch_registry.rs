//! A throwaway Apicurio Registry that a harness may stop and start, beside
//! the shared one on 8081 (which other runs use and must never go down).
//!
//! It runs the stack's own Apicurio distribution (`.stack/apicurio`, fetched
//! by `./dev stack up`) on other ports. The stack's registry keeps schemas in
//! an in-memory H2 database, so a restart would forget every schema and hand
//! out ids from 1 again: records written before the restart would then point
//! at unknown (or different) schemas. This one keeps its H2 database in a
//! file under `dir`, so a stop and start (even a SIGKILL) is a real outage
//! and nothing more: the same ids resolve to the same schemas afterwards.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::Context as _;

/// A registry process of our own, SIGKILLed on drop.
pub struct ScratchRegistry {
    java: PathBuf,
    apicurio: PathBuf,
    port: u16,
    management_port: u16,
    dir: PathBuf,
    child: Option<Child>,
}

impl ScratchRegistry {
    /// A registry on `port` (and `management_port` for Quarkus' health
    /// interface) keeping its database and log in `dir`. Fails if a port is
    /// taken or the distribution is missing. `java` must be 21+ (Apicurio 3).
    pub fn new(
        java: impl Into<PathBuf>,
        apicurio: impl Into<PathBuf>,
        port: u16,
        management_port: u16,
        dir: impl Into<PathBuf>,
    ) -> anyhow::Result<Self> {
        let apicurio = apicurio.into();
        anyhow::ensure!(
            apicurio.join("quarkus-run.jar").exists(),
            "{} has no quarkus-run.jar: run ./dev stack up once to fetch Apicurio",
            apicurio.display()
        );
        for p in [port, management_port] {
            anyhow::ensure!(
                std::net::TcpStream::connect(("127.0.0.1", p)).is_err(),
                "port {p} is taken; the throwaway registry needs it free"
            );
        }
        let dir = dir.into();
        std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
        Ok(Self {
            java: java.into(),
            apicurio,
            port,
            management_port,
            dir,
            child: None,
        })
    }

    /// The Confluent-compatible URL clients use.
    pub fn url(&self) -> String {
        format!("http://127.0.0.1:{}/apis/ccompat/v7", self.port)
    }

    /// Where its database and log live.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Starts the process (it answers some seconds later: [`Self::wait_answering`]).
    pub fn start(&mut self) -> anyhow::Result<()> {
        let log = std::fs::File::options()
            .create(true)
            .append(true)
            .open(self.dir.join("registry.log"))?;
        let child = Command::new(&self.java)
            .current_dir(&self.apicurio)
            .args([
                "-Xms128m",
                "-Xmx384m",
                "-XX:+UseSerialGC",
                "-XX:TieredStopAtLevel=1",
                "-Djava.awt.headless=true",
                "-Dquarkus.http.host=127.0.0.1",
                "-Dquarkus.management.host=127.0.0.1",
                "-Dquarkus.otel.sdk.disabled=true",
                // Confluent semantics, as the stack's registry (see ./dev).
                "-Dapicurio.ccompat.legacy-id-mode.enabled=false",
                "-Dapicurio.ccompat.use-canonical-hash=true",
                "-Dapicurio.datasource.jdbc.initial-size=2",
                "-Dapicurio.datasource.jdbc.min-size=2",
                "-Dapicurio.datasource.jdbc.max-size=20",
            ])
            .arg(format!("-Dquarkus.http.port={}", self.port))
            .arg(format!(
                "-Dquarkus.management.port={}",
                self.management_port
            ))
            // A file database: schemas and ids survive a restart.
            .arg(format!(
                "-Dapicurio.datasource.url=jdbc:h2:file:{}",
                self.dir.join("registry").display()
            ))
            .args(["-jar", "quarkus-run.jar"])
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log)
            .spawn()
            .with_context(|| format!("starting Apicurio with {}", self.java.display()))?;
        self.child = Some(child);
        Ok(())
    }

    /// SIGKILLs the process: the registry is gone at once, as in a crash.
    pub fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// Waits until the registry answers (its subjects list), up to `within`.
    pub async fn wait_answering(&self, within: Duration) -> anyhow::Result<Duration> {
        let start = Instant::now();
        let codec = kjob::codec::Codec::new(&self.url())?;
        loop {
            if codec.ping().await.is_ok() {
                return Ok(start.elapsed());
            }
            anyhow::ensure!(
                start.elapsed() < within,
                "the throwaway registry on {} did not answer within {within:?}; see {}",
                self.port,
                self.dir.join("registry.log").display()
            );
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
    }
}

impl Drop for ScratchRegistry {
    fn drop(&mut self) {
        self.kill();
    }
}
