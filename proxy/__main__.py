from proxy.process.cli import main

raise SystemExit(main())
