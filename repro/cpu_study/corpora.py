"""The corpora ``repro.cpu_study.make_corpus`` builds: each one's pinned Debian packages and
split.

``study`` is the CPU reproduction's mirror (``results/repro/PROTOCOL.md``, "Data"): the kernel's
and Python's documentation, 5% of documents for validation by a hash of their URL, and a test
split from later releases of the same manuals. ``long`` is v4's Q3 corpus ("Q3, twenty tokens
per parameter"): at least 42M training tokens asked, from other packages (``postgresql-doc-*`` and
``perl-doc`` never: they are reserved for an independent check), 1% of documents each for
validation and test by the same hash. A survey (words kept per package after cleaning) chose its
packages: the largest English manuals in Debian, one release of each, in one directory each.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

RST = ".rst.txt"  # Sphinx's copy of a page's reStructuredText source (html/_sources/)
HTML = ".html"  # a rendered page (repro.cpu_study.html_paragraphs)
DEBIAN = "http://deb.debian.org/debian/pool/main/"
DEBIAN_SECURITY = "http://deb.debian.org/debian-security/pool/updates/main/"


@dataclass(frozen=True)
class Package:
    """A Debian package that ships a manual's sources or pages, pinned to one build of it.

    The pin is what makes a rebuild on a fresh machine give the same corpus: Debian replaces a
    package's files in its pool with each point release, and a study spread over several working
    sessions must not train its later runs on other text than its earlier ones. The pool paths
    are tried in order; the file must match ``sha256``. ``suffix`` says how its documents are
    read: reStructuredText sources (``RST``) or rendered pages (``HTML``). ``skip`` names
    documents (paths under ``sources``, without the suffix) that are not read: a single page that
    repeats the whole manual would otherwise take every paragraph from the pages that hold them
    (dedup keeps a paragraph's first occurrence) and arrive in training as one huge document.
    """

    name: str
    version: str
    sha256: str
    pools: tuple[str, ...]  # directories that may hold the .deb, e.g. DEBIAN + "l/linux/"
    sources: str  # the directory of the documents inside the unpacked package
    url_root: str
    suffix: str = RST
    skip: tuple[str, ...] = ()

    @property
    def deb(self) -> str:
        return f"{self.name}_{self.version.split(':')[-1]}_all.deb"


@dataclass(frozen=True)
class Corpus:
    """A corpus's packages and split. Documents go to validation and test by a hash of their URL
    (``validation_percent`` and ``test_percent`` of them); ``test_packages``, where a corpus has
    them, give its test split instead: their documents that ``packages`` lack."""

    name: str
    packages: tuple[Package, ...]
    validation_percent: int
    test_percent: int = 0
    test_packages: tuple[Package, ...] = ()


STUDY_PACKAGES = (
    Package(
        "linux-doc-6.1",
        "6.1.170-3",
        "8a0e80e4f14407d0d96058b9eec7afa4ae57e6408d3f4e2bed35462d14b99342",
        (DEBIAN + "l/linux/", DEBIAN_SECURITY + "l/linux/"),
        "usr/share/doc/linux-doc-6.1/html/_sources",
        "https://www.kernel.org/doc/html/v6.1/",
    ),
    Package(
        "python3.11-doc",
        "3.11.2-6+deb12u8",
        "50eb63e7f636c4281e9ce1b8f10386f1def42159eddce34fc1f41c46261df71b",
        (DEBIAN + "p/python3.11/", DEBIAN_SECURITY + "p/python3.11/"),
        "usr/share/doc/python3.11/html/_sources",
        "https://docs.python.org/3.11/",
    ),
)
# Later releases of the same two manuals, for the study's test split only.
STUDY_TEST_PACKAGES = (
    Package(
        "linux-doc-6.12",
        "6.12.107-1",
        "bc1d4603031c1f668f2189a9abb561a135c87f52b1f1ff93c05b1fe875275816",
        (DEBIAN + "l/linux/", DEBIAN_SECURITY + "l/linux/"),
        "usr/share/doc/linux-doc-6.12/html/_sources",
        "https://www.kernel.org/doc/html/v6.12/",
    ),
    Package(
        "python3.13-doc",
        "3.13.5-2+deb13u5",
        "a8a924637eeb25e666df5bbf7660ae09eb280be9effa39f9f6929e7a452bf65c",
        (DEBIAN + "p/python3.13/", DEBIAN_SECURITY + "p/python3.13/"),
        "usr/share/doc/python3.13/html/_sources",
        "https://docs.python.org/3.13/",
    ),
)
LONG_PACKAGES = (
    # The same pins as the study's test split: the kernel read as rendered pages (its kernel-doc
    # API text is not in _sources), Python's sources as they are.
    replace(STUDY_TEST_PACKAGES[0], sources="usr/share/doc/linux-doc-6.12/html", suffix=HTML),
    STUDY_TEST_PACKAGES[1],
    Package(
        "openjdk-21-doc",
        "21.0.12.1+1-1~deb13u1",
        "25d5fbde8095dced004e7ed713500ea03aa7efd8115e7a2b928041f99974bb11",
        (DEBIAN + "o/openjdk-21/", DEBIAN_SECURITY + "o/openjdk-21/"),
        "usr/share/doc/openjdk-21-jre-headless/api",
        "https://docs.oracle.com/en/java/javase/21/docs/api/",
        HTML,
    ),
    Package(
        "qt6-base-doc-html",
        "6.8.2+dfsg-9+deb13u2",
        "e2db9f4e4e49d1b156d5277f12d3c49054a6f5afa62e86bb7e9c42ee560ed3f9",
        (DEBIAN + "q/qt6-base/", DEBIAN_SECURITY + "q/qt6-base/"),
        "usr/share/qt6/doc",
        "https://doc.qt.io/qt-6.8/",
        HTML,
    ),
    Package(
        "racket-doc",
        "8.16+dfsg1-3",
        "2af18fa9b050a11649aac11aa854637be4ba97c7adeb72c5a1c7348f12c66d88",
        (DEBIAN + "r/racket/", DEBIAN_SECURITY + "r/racket/"),
        "usr/share/doc/racket",
        "https://docs.racket-lang.org/",
        HTML,
    ),
    Package(
        "erlang-doc",
        "1:27.3.4.1+dfsg-1+deb13u3",
        "bbb9c55f0b804a1e8e95194b0a5246904b698b09776eda91e73f24b8fb5d8609",
        (DEBIAN + "e/erlang/", DEBIAN_SECURITY + "e/erlang/"),
        "usr/share/doc/erlang-doc/html",
        "https://www.erlang.org/docs/27/",
        HTML,
    ),
    Package(
        "rust-doc",
        "1.85.1+dfsg1-1+deb13u1",
        "a30c905cfd69a0d37c863a1447b86b2af37008e06eb4d5ba7cbd8b3ce9a07fbe",
        (DEBIAN + "r/rustc/", DEBIAN_SECURITY + "r/rustc/"),
        "usr/share/doc/rust-doc/html",
        "https://doc.rust-lang.org/1.85.1/",
        HTML,
    ),
    Package(
        "llvm-22-doc",
        "1:22.1.8-1~deb13u4",
        "8084e5cbf0a4e4d12e90657ea9d726999f73f76a0a60d49eecfe06e3d696bbfd",
        (DEBIAN + "l/llvm-toolchain-22/", DEBIAN_SECURITY + "l/llvm-toolchain-22/"),
        "usr/share/doc/llvm-22-doc/html/_sources",
        "https://llvm.org/docs/",
        RST,
    ),
    Package(
        "clang-22-doc",
        "1:22.1.8-1~deb13u4",
        "737582b0ac7d1c3cc2ea9b4e88e4a229344a2faa32dd24c82d595482a83631f1",
        (DEBIAN + "l/llvm-toolchain-22/", DEBIAN_SECURITY + "l/llvm-toolchain-22/"),
        "usr/share/doc/clang-22/html/_sources",
        "https://clang.llvm.org/docs/",
        RST,
    ),
    Package(
        "apache2-doc",
        "2.4.68-1~deb13u1",
        "d7470d77fcd8b3952a2b6054cf8ab9b455918205aba91c6e310933cfda9eec80",
        (DEBIAN + "a/apache2/", DEBIAN_SECURITY + "a/apache2/"),
        "usr/share/doc/apache2-doc/manual/en",
        "https://httpd.apache.org/docs/2.4/",
        HTML,
    ),
    Package(
        "php-doc",
        "20241205~git.dfcbb86+dfsg-1",
        "d7e148ab18f61b598878b775f0d3431d97f8bf910020c6eb640892fd4d98af1a",
        (DEBIAN + "p/php-doc/", DEBIAN_SECURITY + "p/php-doc/"),
        "usr/share/doc/php-doc/html",
        "https://www.php.net/manual/en/",
        HTML,
    ),
    Package(
        "python-django-doc",
        "3:4.2.28-0+deb13u2",
        "76a48c3cfcfabbb44dca02cbe37b15920879252824bf990feb9d4ab820671a34",
        (DEBIAN + "p/python-django/", DEBIAN_SECURITY + "p/python-django/"),
        "usr/share/doc/python-django-doc/html",
        "https://docs.djangoproject.com/en/4.2/",
        HTML,
    ),
    Package(
        "lammps-doc",
        "20250204+dfsg.1-2",
        "ea72e20e8cfef3a821efe0ed928c1fdbfeac56f78f221b5b6a5a8920cae4928f",
        (DEBIAN + "l/lammps/", DEBIAN_SECURITY + "l/lammps/"),
        "usr/share/doc/lammps/html",
        "https://docs.lammps.org/",
        HTML,
    ),
    Package(
        "wx3.2-doc",
        "3.2.8+dfsg-2",
        "8a1f76fe8e1150e6ff315070578b8ef068746bc537e20bdb786c30901bb61a52",
        (DEBIAN + "w/wxwidgets3.2/", DEBIAN_SECURITY + "w/wxwidgets3.2/"),
        "usr/share/doc/wx3.2-doc/html",
        "https://docs.wxwidgets.org/3.2/",
        HTML,
    ),
    Package(
        "blender-doc",
        "4.3-1",
        "5b6a1393428420e3e4cdc41dd982a7909f309a5a0c648d476325066058e4ea02",
        (DEBIAN + "b/blender-doc/", DEBIAN_SECURITY + "b/blender-doc/"),
        "usr/share/doc/blender-doc/html",
        "https://docs.blender.org/manual/en/4.3/",
        HTML,
    ),
    Package(
        "sqlite3-doc",
        "3.46.1-7+deb13u2",
        "67d28cb8ec314c609a6b3bd9d91315276843251635ac7fba52247859e58f742f",
        (DEBIAN + "s/sqlite3/", DEBIAN_SECURITY + "s/sqlite3/"),
        "usr/share/doc/sqlite3",
        "https://sqlite.org/",
        HTML,
    ),
    Package(
        "python-scipy-doc",
        "1.15.3-1",
        "27cab5010a6f182fcb9b29bf84b446f5f0e6c5664cb6c409a06fc4d901cb4da5",
        (DEBIAN + "s/scipy/", DEBIAN_SECURITY + "s/scipy/"),
        "usr/share/doc/python-scipy-doc/html",
        "https://docs.scipy.org/doc/scipy-1.15.3/",
        HTML,
    ),
    Package(
        "python-astropy-doc",
        "7.0.1-3",
        "6a0847a6253a9313cc9e166742cc7e1652e5c92a04f4d2cdb4b319f0bb50458e",
        (DEBIAN + "a/astropy/", DEBIAN_SECURITY + "a/astropy/"),
        "usr/share/doc/python-astropy-doc/html",
        "https://docs.astropy.org/en/v7.0.1/",
        HTML,
    ),
    Package(
        "libboost1.88-doc",
        "1.88.0-1",
        "efddeb0deb090cd56ce6506ff3f3270296c0b7eae3fade3d0923eadcd5b6b9f3",
        (DEBIAN + "b/boost1.88/", DEBIAN_SECURITY + "b/boost1.88/"),
        "usr/share/doc/libboost1.88-doc",
        "https://www.boost.org/doc/libs/1_88_0/",
        HTML,
    ),
    Package(
        "python-numpy-doc",
        "1:2.2.4+ds-1",
        "c995ee833e55da051faba4acc151a50f2c90a7ec6d7eafc868d294cbdea34952",
        (DEBIAN + "n/numpy/", DEBIAN_SECURITY + "n/numpy/"),
        "usr/share/doc/python-numpy/html",
        "https://numpy.org/doc/2.2/",
        HTML,
    ),
    Package(
        "git-doc",
        "1:2.47.3-0+deb13u1",
        "5051bf2c067c96b7622632d82895f89720f70ec64c2bda10a1b8311b0538df48",
        (DEBIAN + "g/git/", DEBIAN_SECURITY + "g/git/"),
        "usr/share/doc/git-doc",
        "https://git-scm.com/docs/",
        HTML,
    ),
    Package(
        "octave-doc",
        "9.4.0-1",
        "d0eb111f357825b4500f09449fa51c4e1b648be4376edf89c44e5aafc75a71e7",
        (DEBIAN + "o/octave/", DEBIAN_SECURITY + "o/octave/"),
        "usr/share/doc/octave/octave.html",
        "https://docs.octave.org/v9.4.0/",
        HTML,
    ),
    Package(
        "python-sqlalchemy-doc",
        "2.0.40+ds1-1",
        "715be7ca412315bb53375697152eec4a41830b11a16369bd1894bb048795057a",
        (DEBIAN + "s/sqlalchemy/", DEBIAN_SECURITY + "s/sqlalchemy/"),
        "usr/share/doc/python-sqlalchemy-doc/html",
        "https://docs.sqlalchemy.org/en/20/",
        HTML,
    ),
    Package(
        "python-sklearn-doc",
        "1.4.2+dfsg-8",
        "c213257d8f2afe711f3fdbe6b68560ea4587db580889de4cd1da0be5c1b1d071",
        (DEBIAN + "s/scikit-learn/", DEBIAN_SECURITY + "s/scikit-learn/"),
        "usr/share/doc/python-sklearn-doc/html",
        "https://scikit-learn.org/1.4/",
        HTML,
    ),
    Package(
        "debian-handbook",
        "11.20220922",
        "3d5dbeac1f1afc9c094eab9d0f701f6ecff99c4927d5a4794cf6c85678134faa",
        (DEBIAN + "d/debian-handbook/", DEBIAN_SECURITY + "d/debian-handbook/"),
        "usr/share/doc/debian-handbook/html/en-US",
        "https://debian-handbook.info/browse/en-US/stable/",
        HTML,
    ),
    Package(
        "lilypond-doc-html",
        "2.24.4-5",
        "5c81d776f6d5997c2996609bb9087aaa41c55d73908cfe6693944ece2f3b7d3a",
        (DEBIAN + "l/lilypond/", DEBIAN_SECURITY + "l/lilypond/"),
        "usr/share/doc/lilypond/html/Documentation",
        "https://lilypond.org/doc/v2.24/Documentation/",
        HTML,
    ),
    Package(
        "exim4-doc-html",
        "4.98-1",
        "1c592b2809a9fec22623d89b93dbeb172810811f14309559706e6aff567468a3",
        (DEBIAN + "e/eximdoc4/", DEBIAN_SECURITY + "e/eximdoc4/"),
        "usr/share/doc/exim4-doc-html/spec_html",
        "https://www.exim.org/exim-html-4.98/doc/html/spec_html/",
        HTML,
    ),
    Package(
        "nodejs-doc",
        "20.19.2+dfsg-1+deb13u2",
        "8e236be96ae1ea7570c1dd7e903034820da3c03fd566528d388a2db641a65c21",
        (DEBIAN + "n/nodejs/", DEBIAN_SECURITY + "n/nodejs/"),
        "usr/share/doc/nodejs/api",
        "https://nodejs.org/docs/v20.19.2/api/",
        HTML,
        skip=("all",),  # every page of the manual in one
    ),
    Package(
        "cmake-doc",
        "3.31.6-2",
        "3b9a5d0ea0e1a483a1055ea13a4ebca509c16e45fa276115fae8c206ac3bbb1b",
        (DEBIAN + "c/cmake/", DEBIAN_SECURITY + "c/cmake/"),
        "usr/share/doc/cmake-data/html/_sources",
        "https://cmake.org/cmake/help/v3.31/",
        RST,
    ),
    Package(
        "gimp-help-en",
        "3.0.0-4",
        "b18e0b0763de45eb66a65305c443cf2a03572ec42fc01d6bb2817c5b33e600bf",
        (DEBIAN + "g/gimp-help/", DEBIAN_SECURITY + "g/gimp-help/"),
        "usr/share/gimp/3.0/help/en",
        "https://docs.gimp.org/3.0/en/",
        HTML,
    ),
    Package(
        "zsh-doc",
        "5.9-8",
        "374a3de4bd17fb40216e7bdab324f3e603802235e276a02febef59a8ab2ea543",
        (DEBIAN + "z/zsh/", DEBIAN_SECURITY + "z/zsh/"),
        "usr/share/doc/zsh-common/html",
        "https://zsh.sourceforge.io/Doc/Release/",
        HTML,
    ),
    Package(
        "rsyslog-doc",
        "8.2504.0+dfsg-1+deb13u1",
        "e5ad188b45af1f43bb10dafd365520e2920e345256c3ebde7b55413a220dc20d",
        (DEBIAN + "r/rsyslog-doc/", DEBIAN_SECURITY + "r/rsyslog-doc/"),
        "usr/share/doc/rsyslog-doc/html/_sources",
        "https://www.rsyslog.com/doc/",
        RST,
    ),
    Package(
        "buildbot-doc",
        "4.2.1-1",
        "dd154c15282009fc3f1f9ab805e1584847f259ad2ff47c7cf04e9a43664e9090",
        (DEBIAN + "b/buildbot/", DEBIAN_SECURITY + "b/buildbot/"),
        "usr/share/doc/buildbot/html/_sources",
        "https://docs.buildbot.net/4.2.1/",
        RST,
    ),
    Package(
        "openmpi-doc",
        "5.0.7-1",
        "43d38ea5f489d944c9c5b5d0f76207cb24ec3ad2eef47b7f027ca4aff9885099",
        (DEBIAN + "o/openmpi/", DEBIAN_SECURITY + "o/openmpi/"),
        "usr/share/doc/openmpi-doc/html/html/_sources",
        "https://docs.open-mpi.org/en/v5.0.x/",
        RST,
    ),
    Package(
        "neutron-doc",
        "2:26.0.3-0+deb13u3",
        "c8d8da60f5463b6b5d83d90964516678277c2133c5a6caaa32795c2bf45629db",
        (DEBIAN + "n/neutron/", DEBIAN_SECURITY + "n/neutron/"),
        "usr/share/doc/neutron-doc/html/_sources",
        "https://docs.openstack.org/neutron/2025.1/",
        RST,
    ),
    Package(
        "nova-doc",
        "2:31.0.0-6+deb13u2",
        "0ac1bb83a0e3dc048b1630dcf47b3a9698f8600abe8d7b8c97737f0c5abb4eb5",
        (DEBIAN + "n/nova/", DEBIAN_SECURITY + "n/nova/"),
        "usr/share/doc/nova-doc/html/_sources",
        "https://docs.openstack.org/nova/2025.1/",
        RST,
    ),
    Package(
        "cinder-doc",
        "2:26.0.0-2",
        "fddd57b4a1e5d99e44e9c58c8c59161406556f196cb453dc3bab2a54d8c5e6cf",
        (DEBIAN + "c/cinder/", DEBIAN_SECURITY + "c/cinder/"),
        "usr/share/doc/cinder-doc/html/_sources",
        "https://docs.openstack.org/cinder/2025.1/",
        RST,
    ),
    Package(
        "ironic-doc",
        "1:29.0.5-0+deb13u3",
        "6d612fa37a4bad6b495e23c48da111a7400a6ee3b6ae54c072679b4ecdf4e4ac",
        (DEBIAN + "i/ironic/", DEBIAN_SECURITY + "i/ironic/"),
        "usr/share/doc/ironic-doc/html/_sources",
        "https://docs.openstack.org/ironic/2025.1/",
        RST,
    ),
    Package(
        "ghc-doc",
        "9.6.6-4",
        "0d56601b5c773022caf895cb45cdd14bf8982884b7a6e0895c4caa8993d78993",
        (DEBIAN + "g/ghc/", DEBIAN_SECURITY + "g/ghc/"),
        "usr/share/doc/ghc-doc/html",
        "https://downloads.haskell.org/ghc/9.6.6/docs/",
        HTML,
    ),
    Package(
        "python-pytest-doc",
        "8.3.5-2",
        "e213b5558617e3e6fb03e43fd91e74d363aeffd8fb366a03e74d3e148f54dca2",
        (DEBIAN + "p/pytest/", DEBIAN_SECURITY + "p/pytest/"),
        "usr/share/doc/python-pytest-doc/html/_sources",
        "https://docs.pytest.org/en/8.3.x/",
        RST,
    ),
    Package(
        "python-celery-doc",
        "5.5.2-2",
        "17a6c8501d4a0fa2c524ca2fe23685770c598e46fb3a59fa6269a8b30ab3a146",
        (DEBIAN + "c/celery/", DEBIAN_SECURITY + "c/celery/"),
        "usr/share/doc/python-celery-doc/html/_sources",
        "https://docs.celeryq.dev/en/v5.5.2/",
        RST,
    ),
    Package(
        "varnish-doc",
        "7.7.0-3+deb13u1",
        "ec2f9f3e78c7e78ab40c48e6b38d7011050519084b7a51e365ee4453c61640e4",
        (DEBIAN + "v/varnish/", DEBIAN_SECURITY + "v/varnish/"),
        "usr/share/doc/varnish/html/_sources",
        "https://varnish-cache.org/docs/7.7/",
        RST,
    ),
    Package(
        "libreoffice-help-en-us",
        "4:25.2.3-2+deb13u6",
        "b4717e7f944765f323ac80d91300f0b8fb21802e0570078186b79372675868e3",
        (DEBIAN + "libr/libreoffice/", DEBIAN_SECURITY + "libr/libreoffice/"),
        "usr/share/libreoffice/help/en-US",
        "https://help.libreoffice.org/25.2/en-US/",
        HTML,
    ),
    Package(
        "libvirt-doc",
        "11.3.0-3+deb13u3",
        "9bead28c675bb72b79ad7c43df952d62349c11d95be87d696291a7389c8c497c",
        (DEBIAN + "libv/libvirt/", DEBIAN_SECURITY + "libv/libvirt/"),
        "usr/share/doc/libvirt-doc/html",
        "https://libvirt.org/",
        HTML,
    ),
    Package(
        "postfix-doc",
        "3.10.13-0+deb13u1",
        "7249e06fd1601c5b2dfc76470ee38271445656099d1c87072dd27fb1405cf350",
        (DEBIAN + "p/postfix/", DEBIAN_SECURITY + "p/postfix/"),
        "usr/share/doc/postfix/html",
        "https://www.postfix.org/",
        HTML,
    ),
    Package(
        "maxima-doc",
        "5.47.0-7",
        "f495fdefd2a849c074d563a7c81dbcaba1ac317ff50423661a462666ffff1e46",
        (DEBIAN + "m/maxima/", DEBIAN_SECURITY + "m/maxima/"),
        "usr/share/doc/maxima-doc/html",
        "https://maxima.sourceforge.io/docs/manual/",
        HTML,
    ),
    Package(
        "python-pandas-doc",
        "2.2.3+dfsg-9",
        "2416377a2e2338eed3854daaae92bb49feed2b08cb0e4a6ee1239011bfdc604a",
        (DEBIAN + "p/pandas/", DEBIAN_SECURITY + "p/pandas/"),
        "usr/share/doc/python-pandas-doc/html",
        "https://pandas.pydata.org/pandas-docs/version/2.2.3/",
        HTML,
    ),
    Package(
        "python-statsmodels-doc",
        "0.14.4+dfsg-1",
        "aa38a32696523678930e13b5355fbd4217aab6cf5c0d7f2f39be6a86c6e6812a",
        (DEBIAN + "s/statsmodels/", DEBIAN_SECURITY + "s/statsmodels/"),
        "usr/share/doc/python-statsmodels-doc/html",
        "https://www.statsmodels.org/v0.14.4/",
        HTML,
    ),
    Package(
        "python-dask-doc",
        "2024.12.1+dfsg-2",
        "e397c4fed8d1f1713a2e9c11966622e33b6d20b16db1e0e34ea58751c57b1d8a",
        (DEBIAN + "d/dask/", DEBIAN_SECURITY + "d/dask/"),
        "usr/share/doc/python-dask-doc/html",
        "https://docs.dask.org/en/2024.12.1/",
        HTML,
    ),
    Package(
        "python-matplotlib-doc",
        "3.10.1+dfsg1-4",
        "1be70c2d4a72ffd502e981d4bec55a0762a7d9fd090dd843d4b603bef83a817a",
        (DEBIAN + "m/matplotlib/", DEBIAN_SECURITY + "m/matplotlib/"),
        "usr/share/doc/python-matplotlib-doc/html",
        "https://matplotlib.org/3.10.1/",
        HTML,
    ),
    Package(
        "libopenjfx-java-doc",
        "11.0.11+1-7",
        "1af15a77e4689c5afffa209795d048b900b661ab4ebf3e1755d00a8a713f74d9",
        (DEBIAN + "o/openjfx/", DEBIAN_SECURITY + "o/openjfx/"),
        "usr/share/doc/libopenjfx-java/api",
        "https://openjfx.io/javadoc/11/",
        HTML,
    ),
    Package(
        "libcommons-math3-java-doc",
        "3.6.1-4",
        "409e721e0fcf145a9716c8c1bb9525513566dd4d2e4ea2cb4ccdf5a1605f60ad",
        (DEBIAN + "c/commons-math3/", DEBIAN_SECURITY + "c/commons-math3/"),
        "usr/share/doc/libcommons-math3-java/api/org",
        "https://commons.apache.org/proper/commons-math/javadocs/api-3.6.1/org/",
        HTML,
    ),
    Package(
        "libjfreechart-java-doc",
        "1.5.5-1",
        "471db826b9d2f027fdd3c86ff3513850b79a779b8869d5b104c21ebe11a7062c",
        (DEBIAN + "libj/libjfreechart-java/", DEBIAN_SECURITY + "libj/libjfreechart-java/"),
        "usr/share/doc/libjfreechart-java-doc/api",
        "https://www.jfree.org/jfreechart/javadoc/",
        HTML,
    ),
    Package(
        "libapache-poi-java-doc",
        "4.0.1-6",
        "df3d1e6b7f129c9747b61de48a847d707f09ec0d301194c28d38edd71e727c78",
        (DEBIAN + "liba/libapache-poi-java/", DEBIAN_SECURITY + "liba/libapache-poi-java/"),
        "usr/share/doc/libapache-poi-java/api",
        "https://poi.apache.org/apidocs/4.0/",
        HTML,
    ),
    Package(
        "opencv-doc",
        "4.10.0+dfsg-5",
        "91cd76e170536065f547010e6794a9b567dc1a08ea7e1459b70f500235d98da8",
        (DEBIAN + "o/opencv/", DEBIAN_SECURITY + "o/opencv/"),
        "usr/share/doc/opencv-doc/opencv4/html",
        "https://docs.opencv.org/4.10.0/",
        HTML,
    ),
    Package(
        "libdeal.ii-doc",
        "9.6.2-4",
        "29a13d31dba12812192bae0ffc0dfca4e5953ccc4451d055f0157ca80398d680",
        (DEBIAN + "d/deal.ii/", DEBIAN_SECURITY + "d/deal.ii/"),
        "usr/share/doc/libdeal.ii-doc/html",
        "https://www.dealii.org/9.6.0/",
        HTML,
    ),
    Package(
        "r-doc-html",
        "4.5.0-3",
        "234e6801ee3ac1a30b38292856f8742339af01c94c904d86a4a1b37db57eb2a3",
        (DEBIAN + "r/r-base/", DEBIAN_SECURITY + "r/r-base/"),
        "usr/share/doc/r-doc-html/manual",
        "https://cran.r-project.org/doc/manuals/r-release/",
        HTML,
    ),
    Package(
        "ns3-doc",
        "3.43-2",
        "53ed3acb7307703037d689e8f5dd403872a065d7892c8ba7e9542d207246acf7",
        (DEBIAN + "n/ns3/", DEBIAN_SECURITY + "n/ns3/"),
        "usr/share/doc/ns3/models/html/_sources",
        "https://www.nsnam.org/docs/release/3.43/models/html/",
        RST,
    ),
    Package(
        "twisted-doc",
        "24.11.0-1",
        "d0056c9ade8ed124e5ff69c9dda90583609d75b0a8f8509f85ed06319a7ea20c",
        (DEBIAN + "t/twisted/", DEBIAN_SECURITY + "t/twisted/"),
        "usr/share/doc/twisted-doc/html/_sources",
        "https://docs.twisted.org/en/twisted-24.11.0/",
        RST,
    ),
    Package(
        "pypy3-doc",
        "7.3.19+dfsg-2",
        "3f7d4b7a3422001c8821aa4e1682e394f6dfa415c35929d757550e19713562b3",
        (DEBIAN + "p/pypy3/", DEBIAN_SECURITY + "p/pypy3/"),
        "usr/share/doc/pypy3/html/_sources",
        "https://doc.pypy.org/en/release-pypy3.11-v7.3.19/",
        RST,
    ),
    Package(
        "manila-doc",
        "1:20.0.0-3",
        "e6d759eaff1b44e4a682b8d9914a8c334cb245a08fbf9693baa296edd0558876",
        (DEBIAN + "m/manila/", DEBIAN_SECURITY + "m/manila/"),
        "usr/share/doc/manila-doc/html/_sources",
        "https://docs.openstack.org/manila/2025.1/",
        RST,
    ),
    Package(
        "octavia-doc",
        "16.0.0-2",
        "4e4efcff4f06432bdcd93548793838f1174553d5d5159fe07bf78191420b3a92",
        (DEBIAN + "o/octavia/", DEBIAN_SECURITY + "o/octavia/"),
        "usr/share/doc/octavia-doc/html/_sources",
        "https://docs.openstack.org/octavia/2025.1/",
        RST,
    ),
    Package(
        "keystone-doc",
        "2:27.0.0-3+deb13u5",
        "bb152e77615078e561ae1d7912a81b60a10e879bd18caa44abcfac90502e2f6b",
        (DEBIAN + "k/keystone/", DEBIAN_SECURITY + "k/keystone/"),
        "usr/share/doc/keystone-doc/html/_sources",
        "https://docs.openstack.org/keystone/2025.1/",
        RST,
    ),
    Package(
        "glance-doc",
        "2:30.0.0-3+deb13u2",
        "3f0f0ceb19f6c0d5ca71c1d2c1018bc7ef39e7fc1a818cf219cd2a1e520bcbd8",
        (DEBIAN + "g/glance/", DEBIAN_SECURITY + "g/glance/"),
        "usr/share/doc/glance-doc/html/_sources",
        "https://docs.openstack.org/glance/2025.1/",
        RST,
    ),
    Package(
        "debian-policy",
        "4.7.2.0",
        "942fe167dc16d7f623e5c996332fa50f8b49b8a9970fc219d9ef5775772d0dd1",
        (DEBIAN + "d/debian-policy/", DEBIAN_SECURITY + "d/debian-policy/"),
        "usr/share/doc/debian-policy/policy.html/_sources",
        "https://www.debian.org/doc/debian-policy/",
        RST,
    ),
    Package(
        "developers-reference",
        "13.20",
        "fec366e4b20ea0a74e9990340047c5d5e71d51aa2884ce62e17e59e7ad728015",
        (DEBIAN + "d/developers-reference/", DEBIAN_SECURITY + "d/developers-reference/"),
        "usr/share/developers-reference/_sources",
        "https://www.debian.org/doc/manuals/developers-reference/",
        RST,
    ),
    Package(
        "debian-reference-en",
        "2.127",
        "81d62f642c571dd5ad2de4aa56ba953c488fc9a0aaf0336dc4ef120ff9e367ce",
        (DEBIAN + "d/debian-reference/", DEBIAN_SECURITY + "d/debian-reference/"),
        "usr/share/doc/debian-reference-common/docs",
        "https://www.debian.org/doc/manuals/debian-reference/",
        HTML,
    ),
    Package(
        "gnuradio-doc",
        "3.10.12.0-1",
        "6a0b29bd3b494d2b99f31f66966c71c4cd629df73f9515c4e957bd58270d3f49",
        (DEBIAN + "g/gnuradio/", DEBIAN_SECURITY + "g/gnuradio/"),
        "usr/share/doc/gnuradio-doc/html",
        "https://www.gnuradio.org/doc/doxygen-v3.10.12.0/",
        HTML,
    ),
    Package(
        "groovy-doc",
        "2.4.21-10",
        "0e73a88a95170a8907f2bb8ffce99b8d6cf0fcfcdb2567b2098f077cf82ddc26",
        (DEBIAN + "g/groovy/", DEBIAN_SECURITY + "g/groovy/"),
        "usr/share/doc/groovy",
        "https://docs.groovy-lang.org/2.4.21/html/",
        HTML,
    ),
)

CORPORA = {
    corpus.name: corpus
    for corpus in (
        Corpus("study", STUDY_PACKAGES, 5, test_packages=STUDY_TEST_PACKAGES),
        Corpus("long", LONG_PACKAGES, 1, 1),
    )
}
