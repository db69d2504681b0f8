from validation.collectives.run import main

raise SystemExit(main())
